"""Fixtures: every metadb test here runs against SQLite and a real PostgreSQL server.

The server is one temporary cluster per test session (started with initdb/pg_ctl on a free
127.0.0.1 port, removed at the end); each test gets its own fresh database in it, and its own
SQLite file in tmp_path. Without the PostgreSQL binaries the postgresql cases skip, naming
the Debian package to install.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from triplane.metadb import MetaDB, open_db
from triplane.metadb.testing import MISSING_REASON, PostgresServer, find_pg_bindir


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.skip(MISSING_REASON)
    with PostgresServer(bindir) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a fresh, empty database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'metadb.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


@pytest.fixture
def db(db_url: str) -> Iterator[MetaDB]:
    """An open, migrated metadata DB (closed after the test)."""
    opened = open_db(db_url)
    yield opened
    opened.close()
