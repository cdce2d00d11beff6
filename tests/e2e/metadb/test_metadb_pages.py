"""Job names and tags, and the keyset pages of the REST API's lists, on SQLite and a real
PostgreSQL: every row once and in order (ties on created_at included), the tag filter
(every tag must match), labels set after the job row, and retention taking a job's tags
with it."""

from __future__ import annotations

import sqlalchemy as sa

from triplane import metadb as mdb
from triplane.metadb import MetaDB
from triplane.metadb.models import JobTag
from triplane.metadb.retention import RELEASED, prune_jobs

GRAPH = b'{"nodes":{}}'


def test_job_pages_filters_and_labels(db: MetaDB) -> None:
    with db.transaction() as s:
        for i in range(24):  # eight jobs at each of three instants
            mdb.create_job(s, graph_hash="g", graph_json=GRAPH, fetch=[], job_id=f"j{i:03d}",
                           now=float(i // 8), owner="alice" if i % 2 else "bob",
                           tags=["a", "b"] if i % 4 == 0 else ["a"])
        mdb.set_job_labels(s, "j005", "five", ["b", "c"])
    every: list[str] = []
    before = None
    with db.read() as s:
        while True:
            page = mdb.list_jobs(s, limit=5, before=before)
            every += [j.id for j in page]
            if len(page) < 5:
                break
            before = (page[-1].created_at, page[-1].id)
        assert every == [f"j{i:03d}" for i in reversed(range(24))]
        both = [j.id for j in mdb.list_jobs(s, tags=["a", "b"])]
        assert both == [f"j{i:03d}" for i in (20, 16, 12, 8, 4, 0)]
        assert [j.id for j in mdb.list_jobs(s, tags=["c"])] == ["j005"]
        five = mdb.get_job(s, "j005")
        assert five.name == "five" and five.tags == ("b", "c")
        assert [j.id for j in mdb.list_jobs(s, name="five", owner="alice", since=0.0, until=1.0)] == ["j005"]


def test_tasks_and_tiles_pages_in_key_order(db: MetaDB) -> None:
    with db.transaction() as s:
        mdb.create_job(s, graph_hash="g", graph_json=GRAPH, fetch=[], job_id="j1")
        mdb.insert_tasks(s, "j1", [mdb.NewTask(f"t{i:04d}", "exp") for i in range(250)])
        mdb.record_tiles(s, "j1", [mdb.TileLocation(f"x{i % 2}", (i // 10, i % 10), (1, 1), "float32", 4)
                                   for i in range(60)])
    with db.read() as s:
        tasks, after = [], None
        while page := mdb.task_page(s, "j1", after=after, limit=40):
            tasks += [t.task_id for t in page]
            after = page[-1].task_id
        assert tasks == [f"t{i:04d}" for i in range(250)]
        tiles, key = [], None
        while page := mdb.tile_page(s, "j1", after=key, limit=7):
            tiles += [(t.tensor, t.index) for t in page]
            key = (page[-1].tensor, mdb.index_key(page[-1].index))
        assert len(tiles) == 60 == len(set(tiles))
        assert tiles == sorted(tiles, key=lambda t: (t[0], mdb.index_key(t[1])))


def test_retention_takes_a_jobs_tags_with_it(db: MetaDB) -> None:
    with db.transaction() as s:
        for i in range(3):
            mdb.create_job(s, graph_hash="g", graph_json=GRAPH, fetch=[], job_id=f"j{i}", state="done",
                           now=float(i), tags=["x", "y"])
            mdb.add_events(s, [mdb.NewEvent(f"j{i}", RELEASED, at=float(i))])
    with db.transaction() as s:
        assert prune_jobs(s, keep=1) == 2
    with db.read() as s:
        assert s.execute(sa.select(JobTag.job_id).distinct()).scalars().all() == ["j2"]
        assert [j.id for j in mdb.list_jobs(s, tags=["x"])] == ["j2"]
