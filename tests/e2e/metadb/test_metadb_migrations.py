"""Migrations: applied to an empty database, idempotent, matching the models, safe to race."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from triplane.metadb import SchemaError, create_engine, current_revision, head_revision, migrate, open_db
from triplane.metadb.db import VERSION_TABLE
from triplane.metadb.models import Base

TABLES = {"graphs", "plans", "jobs", "job_tags", "tasks", "tiles", "events", VERSION_TABLE}


def test_migrate_creates_every_table_on_an_empty_database(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        assert current_revision(engine) is None
        assert migrate(db_url) == head_revision()
        assert current_revision(engine) == head_revision()
        insp = sa.inspect(engine)
        assert set(insp.get_table_names()) == TABLES
        assert {"ix_tasks_job_id_state"} <= {i["name"] for i in insp.get_indexes("tasks")}
        assert {"ix_events_job_id_at"} <= {i["name"] for i in insp.get_indexes("events")}
        assert {"ix_jobs_owner_created_at"} <= {i["name"] for i in insp.get_indexes("jobs")}
        uniques = {u["name"] for u in insp.get_unique_constraints("tiles")}
        assert "uq_tiles_job_id_tensor_index_key" in uniques
    finally:
        engine.dispose()


def test_migrate_twice_changes_nothing(db_url: str) -> None:
    migrate(db_url)
    with open_db(db_url) as db, db.read() as s:
        rows = s.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    assert rows == [head_revision()]
    assert migrate(db_url) == head_revision()
    with open_db(db_url) as db, db.read() as s:
        assert s.execute(sa.text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar_one() == 1


def test_head_schema_matches_the_models(db_url: str) -> None:
    migrate(db_url)
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE,
                                                         "compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ: {diff}"


def test_a_newer_unknown_revision_is_refused_and_left_alone(db_url: str) -> None:
    migrate(db_url)
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_future'"))
        with pytest.raises(SchemaError, match="9999_future"):
            open_db(db_url)
        assert current_revision(engine) == "9999_future"
    finally:
        engine.dispose()


def test_concurrent_first_opens_both_succeed(db_url: str) -> None:
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            migrate(db_url)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    engine = create_engine(db_url)
    try:
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_upgrade_from_0001_keeps_jobs_and_adds_the_owner_index_names_and_tags(db_url: str) -> None:
    from alembic import command

    from triplane.metadb.db import _alembic_config

    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "0001_initial")
            conn.execute(sa.text("INSERT INTO graphs (hash, canonical, node_count, created_at) "
                                 "VALUES ('g', :c, 1, 0)"), {"c": b"{}"})
            conn.execute(sa.text("INSERT INTO jobs (id, state, graph_hash, \"fetch\", owner, tasks_total, "
                                 "tasks_done, tasks_failed, created_at, updated_at) VALUES "
                                 "('j1', 'done', 'g', '[]', 'alice', 0, 0, 0, 1, 1)"))
        assert current_revision(engine) == "0001_initial"
        assert migrate(db_url) == head_revision() == "0003_job_names_tags"
        indexes = {i["name"] for i in sa.inspect(engine).get_indexes("jobs")}
        assert {"ix_jobs_owner_created_at", "ix_jobs_name_created_at"} <= indexes
        assert "ix_job_tags_tag_job_id" in {i["name"] for i in sa.inspect(engine).get_indexes("job_tags")}
    finally:
        engine.dispose()
    with open_db(db_url) as db, db.read() as s:
        from triplane import metadb as mdb

        assert [j.id for j in mdb.list_jobs(s, owner="alice")] == ["j1"]
        assert mdb.list_jobs(s, owner="bob") == []
        (old,) = mdb.list_jobs(s)
        assert old.name is None and old.tags == ()  # a job stored before 0003 has neither
