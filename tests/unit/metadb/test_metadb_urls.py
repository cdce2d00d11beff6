"""URLs and opening: schemes, the default run-directory file, SQLite pragmas."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import triplane.metadb as mdb
from triplane.metadb import InvalidInputError
from triplane.metadb.db import normalise_url


@pytest.mark.parametrize("url", ["postgresql://u@h:5432/d", "postgres://u@h/d",
                                 "postgresql+psycopg://u@h/d"])
def test_postgres_urls_use_psycopg3(url: str) -> None:
    assert normalise_url(url).drivername == "postgresql+psycopg"


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(InvalidInputError, match=r"unknown database URL scheme 'mysql' \(known schemes"):
        normalise_url("mysql://u@h/d")
    with pytest.raises(InvalidInputError, match="not a database URL"):
        normalise_url("::::")


def test_in_memory_sqlite_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="file path"):
        mdb.open_db("sqlite://")


def test_default_url_is_a_file_in_the_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIPLANE_HOME", str(tmp_path / "home"))
    assert mdb.default_url() == f"sqlite:///{(tmp_path / 'home' / 'metadb.sqlite3').resolve()}"
    db = mdb.open_db()
    try:
        assert (tmp_path / "home" / "metadb.sqlite3").is_file()
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        db.close()


def test_a_failed_transaction_rolls_back(tmp_path: Path) -> None:
    with mdb.open_db(run_dir=tmp_path) as db:
        with pytest.raises(RuntimeError, match="midway"), db.transaction() as s:
            mdb.create_job(s, graph_hash="h", graph_json=b'{"nodes":{}}', fetch=[], job_id="j1")
            raise RuntimeError("midway")
        with db.read() as s:
            assert mdb.list_jobs(s) == []
            assert s.execute(sa.text("SELECT count(*) FROM graphs")).scalar_one() == 0


def test_public_api_is_pinned() -> None:
    assert sorted(mdb.__all__) == sorted(set(mdb.__all__))
    for name in ("open_db", "migrate", "MetaDB", "BatchWriter", "create_job", "get_job", "list_jobs",
                 "set_job_state", "upsert_plan", "insert_tasks", "transition_task", "record_tiles",
                 "list_tiles", "add_events", "list_events", "jobs_to_resume", "UnknownJobError",
                 "task_page", "tile_page", "task_events", "index_key", "set_job_labels", "max_event_seq",
                 "stream_events", "insert_job", "job_rows", "write_job_rows", "JobRows"):
        assert name in mdb.__all__ and hasattr(mdb, name)
    assert len(mdb.__all__) == 65
