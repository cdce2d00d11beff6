"""Keyset pages of the metadb (the REST API's lists, docs/api.md): every row once, in
order, ties on the sort key included, and each page one indexed range read -- SQLite's
query plan for the statements the page functions run seeks an index (``SEARCH``), never
scans a table, so a page deep into a 100,000-task job costs what the first one does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from triplane import metadb as mdb

GRAPH = b'{"nodes":{}}'


@pytest.fixture
def db(tmp_path: Path) -> Iterator[mdb.MetaDB]:
    with mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}") as d:
        yield d


@contextmanager
def statements(db: mdb.MetaDB) -> Iterator[list[tuple[str, Any]]]:
    """The SELECT statements run meanwhile, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def hook(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, params))

    sa.event.listen(db.engine, "before_cursor_execute", hook)
    try:
        yield seen
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", hook)


def plans(db: mdb.MetaDB, run: Callable[[Any], Any]) -> list[str]:
    """SQLite's query plan lines of every SELECT ``run(session)`` executes."""
    with statements(db) as seen, db.read() as s:
        run(s)
    out = []
    with db.engine.connect() as conn:
        for statement, params in seen:
            out += [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params)]
    return out


def test_pages_of_a_big_job_are_index_seeks_and_cover_every_task_and_tile_once(db: mdb.MetaDB) -> None:
    with db.transaction() as s:
        mdb.create_job(s, graph_hash="g", graph_json=GRAPH, fetch=[], job_id="jbig")
        mdb.insert_tasks(s, "jbig", [mdb.NewTask(f"t{i:05d}", "exp") for i in range(5000)])
        mdb.record_tiles(s, "jbig", [mdb.TileLocation(f"x{i % 3}", (i,), (1,), "float32", 4, "n1")
                                     for i in range(3000)])
    seen: list[str] = []
    after = None
    with db.read() as s:
        while True:
            page = mdb.task_page(s, "jbig", after=after, limit=700)
            seen += [t.task_id for t in page]
            if len(page) < 700:
                break
            after = page[-1].task_id
    assert seen == [f"t{i:05d}" for i in range(5000)]
    tiles: list[tuple[str, tuple[int, ...]]] = []
    key = None
    with db.read() as s:
        while True:
            page = mdb.tile_page(s, "jbig", after=key, limit=400)
            tiles += [(t.tensor, t.index) for t in page]
            if len(page) < 400:
                break
            key = (page[-1].tensor, mdb.index_key(page[-1].index))
    assert len(tiles) == 3000 and len(set(tiles)) == 3000
    assert tiles == sorted(tiles, key=lambda t: (t[0], mdb.index_key(t[1])))
    for run in (lambda s: mdb.task_page(s, "jbig", after="t04000", limit=51),
                lambda s: mdb.tile_page(s, "jbig", after=("x1", "1501"), limit=51),
                lambda s: mdb.task_events(s, "jbig", ["t00001", "t00002"], ["task.ready"])):
        lines = plans(db, run)
        assert lines and all(not ln.startswith("SCAN") for ln in lines), lines
        assert any(ln.startswith("SEARCH tasks") or ln.startswith("SEARCH tiles")
                   or ln.startswith("SEARCH events") for ln in lines), lines


def test_job_pages_keep_ties_on_created_at_apart_and_filter_in_the_index(db: mdb.MetaDB) -> None:
    with db.transaction() as s:
        for i in range(30):  # ten jobs each at three instants: the id breaks the ties
            mdb.create_job(s, graph_hash="g", graph_json=GRAPH, fetch=[], job_id=f"j{i:03d}",
                           now=float(i // 10), name="even" if i % 2 == 0 else "odd",
                           tags=["t"] if i % 3 == 0 else [])
    every: list[str] = []
    before = None
    with db.read() as s:
        while True:
            page = mdb.list_jobs(s, limit=7, before=before)
            every += [j.id for j in page]
            if len(page) < 7:
                break
            before = (page[-1].created_at, page[-1].id)
        assert every == [f"j{i:03d}" for i in reversed(range(30))]
        assert [j.id for j in mdb.list_jobs(s, name="even", tags=["t"], limit=100)] == \
            [f"j{i:03d}" for i in reversed(range(30)) if i % 6 == 0]
        assert [j.id for j in mdb.list_jobs(s, since=1.0, until=2.0, limit=100)] == \
            [f"j{i:03d}" for i in reversed(range(10, 20))]
    lines = plans(db, lambda s: mdb.list_jobs(s, limit=51, before=(1.0, "j015")))
    assert any(ln.startswith("SEARCH jobs USING INDEX") for ln in lines), lines
    assert not any(ln.startswith("SCAN jobs") for ln in lines), lines
    with pytest.raises(mdb.InvalidInputError, match="tags"), db.transaction() as s:
        mdb.create_job(s, graph_hash="g", graph_json=GRAPH, fetch=[], tags=["x"] * 17)
