"""A running job's timeline histogram (triplane/scheduler/timeline.py) against the rows it
summarises, as they land in waves: every started row counted once after each refresh, per
node as a direct grouping counts them; the resolution doubles as the job grows; a retried
task whose row moves later is not counted twice; a window is cut from the cells."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from triplane import metadb as mdb
from triplane.metadb import aggregates as agg
from triplane.metadb.models import Task
from triplane.scheduler.timeline import CELLS, JobHistogram

T0 = 1_700_000_000.0
N = 6000


@pytest.fixture
def db(tmp_path: Path) -> Iterator[mdb.MetaDB]:
    with mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}") as d:
        with d.transaction() as s:
            mdb.create_job(s, graph_hash="g", graph_json=b'{"nodes":{}}', fetch=[], job_id="j1")
            mdb.insert_tasks(s, "j1", [mdb.NewTask(f"t{i:05d}", "exp", predicted_s=1e-3) for i in range(N)])
        yield d


def _run(db: mdb.MetaDB, lo: int, hi: int) -> None:
    """Tasks lo..hi-1 ran: task i on n{i % 3} from T0 + i ms for half a millisecond."""
    with db.transaction() as s:
        for i in range(lo, hi):
            s.execute(sa.update(Task).where(Task.job_id == "j1", Task.task_id == f"t{i:05d}").values(
                node=f"n{i % 3}", started_at=T0 + i * 1e-3, finished_at=T0 + i * 1e-3 + 5e-4, state="done"))


def _refresh(db: mdb.MetaDB, h: JobHistogram) -> tuple[float, float, int]:
    with db.read() as s:
        first, last, rows = agg.task_bounds(s, "j1")
        h.refresh(s, first, last, rows)
    return first, last, rows


def test_every_row_once_after_each_wave(db: mdb.MetaDB) -> None:
    h = JobHistogram("j1")
    resolutions = []
    for lo in range(0, N, 1000):
        _run(db, lo, lo + 1000)
        first, last, rows = _refresh(db, h)
        resolutions.append(h.res)
        lanes = h.lanes(first, last + 1e-6, 50)
        assert h.counted == rows == lo + 1000
        assert {n: sum(v["tasks"]) for n, v in lanes.items()} == \
            {f"n{k}": len(range(k, lo + 1000, 3)) for k in range(3)}
        assert max(k for _, k in h.cells) < CELLS
    assert resolutions[-1] > resolutions[0]  # it coarsened as the job grew
    # a window is cut from the cells: the first second holds tasks 0..999
    half = h.lanes(T0, T0 + 1.0, 10)
    assert sum(sum(v["tasks"]) for v in half.values()) == pytest.approx(1000, abs=3 * h.res / 1e-3)


def test_a_retried_task_is_counted_once(db: mdb.MetaDB) -> None:
    h = JobHistogram("j1")
    _run(db, 0, 3000)
    _refresh(db, h)
    with db.transaction() as s:  # t00010 ran again, later, as its second attempt
        s.execute(sa.update(Task).where(Task.job_id == "j1", Task.task_id == "t00010").values(
            started_at=T0 + 2.9995, finished_at=T0 + 3.0, attempt=2))
    _refresh(db, h)
    assert h.counted == 3000
    assert sum(v[0] for v in h.cells.values()) == 3000 and sum(v[4] for v in h.cells.values()) == 1
