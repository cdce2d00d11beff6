"""The dashboard's aggregates of task and tile rows (triplane/metadb/aggregates.py): the
timeline's buckets hold every started task once, in the bucket of its kernel start, with
its busy, predicted, failed and retried figures; a window lists the tasks overlapping it;
tile totals group by node, engine and state. On SQLite and on a real PostgreSQL server
(conftest.py's ``db``: the bucket index is a floor on PostgreSQL, a cast on SQLite)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from triplane import metadb as mdb
from triplane.metadb import aggregates as agg
from triplane.metadb.models import Task

T0 = 1_700_000_000.0


@pytest.fixture
def seeded(db: mdb.MetaDB) -> mdb.MetaDB:
    with db.transaction() as s:
        mdb.create_job(s, graph_hash="g", graph_json=b'{"nodes":{}}', fetch=[], job_id="j1")
        mdb.insert_tasks(s, "j1", [mdb.NewTask(f"t{i:03d}", "exp", predicted_s=0.5) for i in range(100)])
        # task i runs on n{i%2} from T0 + i*0.1 for 0.05 s; every 10th failed, every 7th was retried;
        # the last 10 have not started
        for i in range(90):
            s.execute(sa.update(Task).where(Task.job_id == "j1", Task.task_id == f"t{i:03d}").values(
                node=f"n{i % 2}", started_at=T0 + i * 0.1, finished_at=T0 + i * 0.1 + 0.05,
                state="failed" if i % 10 == 0 else "done", attempt=2 if i % 7 == 0 else 1))
        mdb.record_tiles(s, "j1", [mdb.TileLocation(f"x{i % 3}", (i,), (1,), "float32", 4, f"n{i % 2}")
                                   for i in range(30)])
    return db


def test_buckets_hold_every_started_task_once(seeded: mdb.MetaDB) -> None:
    with seeded.read() as s:
        first, last, rows = agg.task_bounds(s, "j1")
        assert (first, rows) == (T0, 90) and last == pytest.approx(T0 + 8.95)
        got = agg.timeline_buckets(s, "j1", T0, T0 + 9.0, 9)  # one bucket a second: 10 tasks each
    assert sum(r["tasks"] for r in got) == 90
    per = {(r["node"], r["bucket"]): r for r in got}
    assert {b for _, b in per} == set(range(9)) and {n for n, _ in per} == {"n0", "n1"}
    assert per[("n0", 0)]["tasks"] == 5 and per[("n0", 0)]["failed"] == 1  # t000 of t000..t008
    assert per[("n0", 0)]["busy_s"] == pytest.approx(0.25) and per[("n0", 0)]["predicted_s"] == 2.5
    assert sum(r["retried"] for r in got) == len([i for i in range(90) if i % 7 == 0])
    assert sum(r["failed"] for r in got) == 9


def test_a_window_lists_the_tasks_that_overlap_it(seeded: mdb.MetaDB) -> None:
    with seeded.read() as s:
        inside = agg.tasks_in_window(s, "j1", T0 + 1.02, T0 + 1.5, 100)
        assert [t.task_id for t in inside] == [f"t{i:03d}" for i in range(10, 15)]  # t010 ends at 1.05
        assert len(agg.tasks_in_window(s, "j1", T0, T0 + 100, 20)) == 20
        with pytest.raises(mdb.InvalidInputError, match="buckets"):
            agg.timeline_buckets(s, "j1", T0, T0 + 1, 0)
        with pytest.raises(mdb.InvalidInputError, match="after its start"):
            agg.timeline_buckets(s, "j1", T0, T0, 5)
        with pytest.raises(mdb.UnknownJobError):
            agg.task_bounds(s, "nope")


def test_tile_totals_group_by_node_engine_and_state(seeded: mdb.MetaDB) -> None:
    with seeded.read() as s:
        totals = agg.tile_totals(s)
    assert sum(t["tiles"] for t in totals) == 30 and sum(t["bytes"] for t in totals) == 120
    assert {t["node"] for t in totals} == {"n0", "n1"}
