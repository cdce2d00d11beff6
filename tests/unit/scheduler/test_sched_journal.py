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
    j = Journal(db, lambda job: (True, 0, 1))
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
        assert [(e.kind, e.task_id) for e in mdb.list_events(s, "j1")] == [
            ("task.recomputed", "n3"), ("job.progress", None)]
        assert mdb.get_task(s, "j2", "n0").node == "ex1"  # written once its rows existed
        assert [t.node for t in mdb.list_tiles(s, "j2", "n0")] == ["ex1"]


def test_one_jobs_bad_record_does_not_lose_another_jobs_writes(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    j = Journal(db, lambda job: (True, 0, 1))
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
    j = Journal(db, lambda job: (True, 0, 1))
    j.open()
    j.hold("j1")
    j.transitions([Transitioned("j1", f"n{i}", "pending", "ready", 0, None, "submit:j1", 1.0)
                   for i in range(300)])
    j.transitions([Transitioned("j1", "n300", "pending", "ready", 0, None, "reply:j1.n299.a0", 1.5)])
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


def reply(job: str, task: str, start: float, end: float) -> Reply:
    out = (TileInfo(f"{job}.{task}", (2,), "float32", 8),)
    return Reply(f"{job}.{task}.a0", True, Timings(start - 0.5, start, end), out)


def test_a_done_tasks_row_holds_its_kernels_times_even_when_the_jobs_end_flushes_between(
        tmp_path: Path) -> None:
    db = open_db(tmp_path)
    store(db, "j1", 3)
    j = Journal(db, lambda job: (True, 0, 1))
    j.open()
    for i, task in enumerate(("n0", "n1")):
        j.transitions([Transitioned("j1", task, "ready", "dispatched", 0, "ex0", "s", 10.0)])
        j.output("j1", task, "ex0", reply("j1", task, 10.5 + i, 10.75 + i), tiles=task == "n0")
        j.transitions([Transitioned("j1", task, "dispatched", "done", 0, "ex0", "s", 20.0)])
    j.flush()
    # The last reply: the shell reports the job's end (which flushes) before the task's
    # done transition reaches the journal.
    j.transitions([Transitioned("j1", "n2", "ready", "dispatched", 0, "ex1", "s", 30.0)])
    j.output("j1", "n2", "ex1", reply("j1", "n2", 30.25, 31.0), tiles=False)
    j.job_ended("j1", "done", 3, None)
    j.transitions([Transitioned("j1", "n2", "dispatched", "done", 0, "ex1", "s", 32.0)])
    j.close()
    with db.read() as s:
        rows = {t.task_id: (t.state, t.started_at, t.finished_at, t.actual_s)
                for t in mdb.list_tasks(s, "j1")}
        assert rows == {"n0": ("done", 10.5, 10.75, 0.25), "n1": ("done", 11.5, 11.75, 0.25),
                        "n2": ("done", 30.25, 31.0, 0.75)}
        # tiles=False: the times only, no tile row.
        assert [t.node for t in mdb.list_tiles(s, "j1", "n0")] == ["ex0"]
        assert mdb.list_tiles(s, "j1", "n1") == [] and mdb.list_tiles(s, "j1", "n2") == []
        assert mdb.get_job(s, "j1").state == "done"


def test_kernel_times_wait_with_a_held_job_and_unmatched_ones_are_dropped(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    store(db, "j1", 2)
    j = Journal(db, lambda job: (True, 0, 1))
    j.open()
    j.hold("j2")
    j.transitions([Transitioned("j2", "n0", "ready", "dispatched", 0, "ex0", "s", 1.0)])
    j.output("j2", "n0", "ex0", reply("j2", "n0", 1.5, 2.5), tiles=False)
    j.transitions([Transitioned("j2", "n0", "dispatched", "done", 0, "ex0", "s", 3.0)])
    # A reply whose done transition never comes (its job failed meanwhile) ...
    j.output("j1", "n0", "ex0", reply("j1", "n0", 4.0, 5.0), tiles=False)
    for i in range(3):  # ... is kept for one flush, then dropped (held j2's are not)
        j.transitions([Transitioned("j1", "n1", "ready", "dispatched", i, "ex0", "s", 6.0)])
        j.flush()
    j.transitions([Transitioned("j1", "n0", "ready", "done", 0, "ex0", "s", 7.0)])
    store(db, "j2", 1)
    j.release("j2")
    j.close()
    with db.read() as s:
        n0 = mdb.get_task(s, "j1", "n0")
        assert (n0.state, n0.started_at, n0.finished_at, n0.actual_s) == ("done", None, 7.0, None)
        held = mdb.get_task(s, "j2", "n0")
        assert (held.state, held.started_at, held.finished_at, held.actual_s) == ("done", 1.5, 2.5, 1.0)


def test_a_small_jobs_rows_and_its_release_go_with_the_writers_batches(tmp_path: Path) -> None:
    """A compiled step's rows are queued (``new_job``), its task runs and ends, and its
    release is a queued event (``note``): all written by the writer, in order; a job the
    writer does not know is left to the caller (``note`` is False)."""
    db = open_db(tmp_path)
    j = Journal(db, lambda job: (False, 1, 1))
    j.open()
    rows = mdb.job_rows(graph_hash="h", graph_json=GRAPH, fetch=[], job_id="step", state="running", now=1.0,
                        tasks=[mdb.NewTask("n0", "group", "ready")])
    j.hold("step")
    j.new_job(rows)
    ran(j, "step", "n0", "ex0")
    j.release("step")
    j.job_ended("step", "done", 1, None)
    assert j.note("step", "job.released") and not j.note("unknown", "job.released")
    j.close()
    with db.read() as s:
        info = mdb.get_job(s, "step")
        assert (info.state, info.tasks_done) == ("done", 1)
        assert mdb.get_task(s, "step", "n0").node == "ex0"
        assert "job.released" in [e.kind for e in mdb.list_events(s, "step")]
