"""Opening the metadata DB: URLs, engines, sessions and programmatic migrations.

``open_db(url)`` is the one entry point: it normalises the URL, creates the engine (with
SQLite's pragmas or PostgreSQL's psycopg 3 driver), brings the schema to the latest Alembic
revision, and returns a ``MetaDB`` whose ``transaction()`` hands out sessions.

URLs: ``sqlite:///path/metadb.sqlite3`` (the default, in the run directory),
``postgresql://user@host:port/db`` (``postgres://`` and ``postgresql+psycopg://`` are the same).
Other schemes are refused with the list of known ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from triplane.metadb.errors import InvalidInputError, SchemaError

MIGRATIONS = Path(__file__).with_name("migrations")
VERSION_TABLE = "triplane_schema_version"
DB_FILE = "metadb.sqlite3"
KNOWN_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgres")
# Any constant works: it only has to be the same for every triplane process on a database.
_PG_MIGRATION_LOCK = 0x7472_6970_6C61  # "tripla"


def default_url(run_dir: str | os.PathLike[str] | None = None) -> str:
    """The embedded-mode URL: a SQLite file in the run directory (``TRIPLANE_HOME``, default
    ``~/.triplane``). The directory is created if missing."""
    base = Path(run_dir) if run_dir is not None else Path(
        os.environ.get("TRIPLANE_HOME", Path.home() / ".triplane"))
    base.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(base / DB_FILE).resolve()}"


def normalise_url(url: str | URL) -> URL:
    """The SQLAlchemy URL for ``url``, with PostgreSQL pinned to the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError, but be total on odd input
        raise InvalidInputError(f"not a database URL: {url!r} ({exc})") from None
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername == "sqlite":
        return parsed
    raise InvalidInputError(
        f"unknown database URL scheme {parsed.drivername!r} (known schemes: {list(KNOWN_SCHEMES)})")


WAL_LIMIT_BYTES = 1 << 20  # SQLite's WAL is cut back to this after a checkpoint


def _sqlite_engine(url: URL) -> Engine:
    # A file database is shared by the scheduler's threads; an in-memory one would be private
    # to each pooled connection, which silently loses data, so it is refused.
    if url.database in (None, "", ":memory:"):
        raise InvalidInputError("SQLite needs a file path (sqlite:///path/metadb.sqlite3), not :memory:")
    Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from pysqlite so that "begin" below decides how to begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")      # readers never block the writer
        cur.execute("PRAGMA synchronous=NORMAL")    # durable at checkpoints; safe with WAL
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        # The WAL is checkpointed every 256 pages (1 MiB) and cut back to 1 MiB after: left at
        # its high-water mark, one 100,000-task insert would keep hundreds of MiB of WAL on
        # disk for good (the run directory stays flat over a long run: docs/metadb.md).
        cur.execute("PRAGMA wal_autocheckpoint=256")
        cur.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # A deferred transaction that reads and then writes cannot wait for the write lock
        # (SQLite answers "database is locked" at once), so writers take it up front.
        readonly = conn.get_execution_options().get("triplane_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def create_engine(url: str | URL) -> Engine:
    """An engine for ``url`` (see the module docstring), without touching the schema."""
    parsed = normalise_url(url)
    if parsed.drivername == "sqlite":
        return _sqlite_engine(parsed)
    return sa.create_engine(parsed, pool_pre_ping=True, pool_size=8, max_overflow=8)


def _alembic_config(conn: sa.Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    cfg.attributes["version_table"] = VERSION_TABLE
    return cfg


def head_revision() -> str:
    """The latest schema revision this version of triplane knows."""
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None, "no migrations shipped"
    return head


def current_revision(engine: Engine) -> str | None:
    """The schema revision stored in the database, or None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def migrate_engine(engine: Engine) -> str:
    """Bring the schema to the head revision in one transaction; returns the revision.

    Idempotent: at head it changes nothing. Concurrent callers are serialised (an advisory
    lock on PostgreSQL, the write lock on SQLite), so two processes starting on an empty
    database do not both create tables. Raises SchemaError, with the database unchanged, if
    the stored revision is unknown to this triplane (a newer one wrote it) or a step fails.
    """
    head = head_revision()
    script = ScriptDirectory(str(MIGRATIONS))
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
            stored = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
            if stored is not None and stored != head:
                try:
                    script.get_revision(stored)
                except Exception:
                    raise SchemaError(
                        f"the database is at schema revision {stored!r}, unknown to this triplane "
                        f"(its latest is {head!r}); upgrade triplane or use another database") from None
            if stored != head:
                command.upgrade(_alembic_config(conn), "head")
    except SchemaError:
        raise
    except sa.exc.SQLAlchemyError as exc:
        raise SchemaError(f"migrating the metadata DB failed (rolled back): {exc}") from exc
    return head


def migrate(url: str | URL) -> str:
    """Migrate the database at ``url`` to the head revision (see ``migrate_engine``)."""
    engine = create_engine(url)
    try:
        return migrate_engine(engine)
    finally:
        engine.dispose()


class MetaDB:
    """An open metadata DB: an engine, its schema at head, and a session factory.

    Thread-safe: each ``transaction()`` uses its own pooled connection. ``close()`` disposes
    of the pool; a closed MetaDB must not be used again.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(
            engine.execution_options(triplane_readonly=True), expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session in one transaction: committed when the block ends, rolled back (and the
        exception re-raised) if it raises."""
        with self._sessions.begin() as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reads only (on SQLite it does not take the write lock); never commits."""
        with self._read_sessions() as session:
            try:
                yield session
            finally:
                session.rollback()

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> MetaDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_db(url: str | URL | None = None, *, run_dir: str | os.PathLike[str] | None = None,
            migrate: bool = True) -> MetaDB:
    """Open (and by default migrate) the metadata DB at ``url``, or the run directory's SQLite
    file when ``url`` is None. Raises InvalidInputError for a bad URL and SchemaError for a
    schema it cannot bring to head; the engine is disposed of on failure."""
    engine = create_engine(url if url is not None else default_url(run_dir))
    try:
        if migrate:
            migrate_engine(engine)
    except BaseException:
        engine.dispose()
        raise
    return MetaDB(engine)
