"""The journal: the dispatcher's transitions and output tiles reach metadb in bulk, held
jobs wait for their rows, and one job's bad record does not lose another's writes."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from triplane import metadb as mdb
from triplane.metadb.models import Tile
from triplane.proto.packet import Reply, TileInfo, Timings
from triplane.scheduler.dispatch.state import Transitioned
from triplane.scheduler.journal import Journal

GRAPH = b'{"nodes":{},"outputs":[],"version":1}'


def open_db(tmp_path: Path) -> mdb.MetaDB:
    return mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")


def store(db: mdb.MetaDB, job: str, n: int) -> None:
    with db.transaction() as s:
        mdb.create_job(s, graph_hash="h", graph_json=GRAPH, fetch=[], job_id=job, state="running")
        mdb.insert_tasks(s, job, [mdb.NewTask(f"n{i}", "full", "ready") for i in range(n)])


def ran(j: Journal, job: str, task: str, node: str, attempt: int = 0) -> None:
    """What the shell reports for one task: dispatched, its output, done."""
    j.transitions([Transitioned(job, task, "ready", "dispatched", attempt, node, "s", 1.0)])
    j.output(job, task, node, Reply(f"{job}.{task}.a{attempt}", True, Timings(1.0, 1.0, 2.0),
                                    (TileInfo(f"{job}.{task}", (2,), "float32", 8),)))
    j.transitions([Transitioned(job, task, "dispatched", "done", attempt, node, "s", 2.0)])


def test_tasks_and_tiles_reach_metadb_and_a_held_job_waits_for_its_rows(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    j = Journal(db, lambda job: (True, 0))
    j.open()
    j.hold("j2")  # dispatched while its rows are still being inserted
    store(db, "j1", 500)
    for i in range(500):
        ran(j, "j1", f"n{i}", "ex0")
    ran(j, "j2", "n0", "ex1")
    # n3 drifted from ex0 to ex1: an event beside the task row.
    j.transitions([Transitioned("j1", "n3", "done", "ready", 1, None, "node-down:ex0", 3.0)])
    ran(j, "j1", "n3", "ex1", attempt=1)
    j.flush()
    store(db, "j2", 1)
    j.release("j2")
    j.close()
    with db.read() as s:
        tasks = {t.task_id: t for t in mdb.list_tasks(s, "j1")}
        assert all(t.state == "done" and t.finished_at == 2.0 for t in tasks.values())
        assert (tasks["n3"].attempt, tasks["n3"].node, tasks["n0"].node) == (1, "ex1", "ex0")
        assert [(t.node, t.shape, t.nbytes, t.state) for t in mdb.list_tiles(s, "j1", "n3")] == [
            ("ex1", (2,), 8, "present")]
        assert len(s.scalars(sa.select(Tile)).all()) == 501
        assert [(e.kind, e.task_id) for e in mdb.list_events(s, "j1")] == [("task.ready", "n3")]
        assert mdb.get_task(s, "j2", "n0").node == "ex1"  # written once its rows existed
        assert [t.node for t in mdb.list_tiles(s, "j2", "n0")] == ["ex1"]


def test_one_jobs_bad_record_does_not_lose_another_jobs_writes(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    j = Journal(db, lambda job: (True, 0))
    j.open()
    store(db, "j1", 2)
    ran(j, "j1", "n0", "ex0")
    ran(j, "j-unknown", "n0", "ex0")  # e.g. its rows could not be stored: refused, logged
    ran(j, "j1", "n1", "ex0")
    j.close()
    with db.read() as s:
        assert [t.state for t in mdb.list_tasks(s, "j1")] == ["done", "done"]
        assert [t.node for t in mdb.list_tiles(s, "j1", "n1")] == ["ex0"]


def test_a_stored_jobs_submit_transitions_are_not_written_again(tmp_path: Path) -> None:
    # The submit's waiting -> ready moves are what the inserted rows say already; a task
    # made ready later (its input done) is written as usual.
    db = open_db(tmp_path)
    j = Journal(db, lambda job: (True, 0))
    j.open()
    j.hold("j1")
    j.transitions([Transitioned("j1", f"n{i}", "waiting", "ready", 0, None, "submit:j1", 1.0)
                   for i in range(300)])
    j.transitions([Transitioned("j1", "n300", "waiting", "ready", 0, None, "reply:j1.n299.a0", 1.5)])
    ran(j, "j1", "n0", "ex0")
    with db.transaction() as s:
        mdb.create_job(s, graph_hash="h", graph_json=GRAPH, fetch=[], job_id="j1", state="running")
        mdb.insert_tasks(s, "j1", [mdb.NewTask(f"n{i}", "full", "ready" if i < 300 else "pending")
                                   for i in range(301)])
    j.release("j1")
    j.close()
    assert j.writer is not None and j.writer.stats.items == 4  # n0, its tile, n300, job progress
    with db.read() as s:
        states = {t.task_id: t.state for t in mdb.list_tasks(s, "j1")}
    assert (states["n0"], states["n1"], states["n299"], states["n300"]) == ("done", "ready", "ready", "ready")
