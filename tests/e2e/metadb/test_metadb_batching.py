"""BatchWriter: thousands of hot-path writes become a handful of commits, on both backends."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from triplane import metadb as mdb
from triplane.metadb import BatchWriter, MetaDB, NewTask

GRAPH = b'{"nodes":{"x":{"op":"input"}},"outputs":["x"],"version":1}'


def make_job(db: MetaDB, n_tasks: int) -> str:
    with db.transaction() as s:
        job = mdb.create_job(s, graph_hash="h-batch", graph_json=GRAPH, fetch=["x"])
        mdb.insert_tasks(s, job.id, [NewTask(f"t{i:05d}", "noop") for i in range(n_tasks)])
    return job.id


class CommitCounter:
    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        self.engine = engine
        sa.event.listen(engine, "commit", self._on_commit)

    def _on_commit(self, _conn: Any) -> None:
        self.count += 1

    def remove(self) -> None:
        sa.event.remove(self.engine, "commit", self._on_commit)


def test_5000_transitions_take_a_handful_of_commits(db: MetaDB, capsys: pytest.CaptureFixture[str]) -> None:
    job = make_job(db, 1250)
    counter = CommitCounter(db.engine)
    t0 = time.perf_counter()
    with BatchWriter(db, max_items=500, max_delay=0.05) as w:
        for state in ("pending", "ready", "dispatched", "done"):
            for i in range(1250):
                w.transition(job, f"t{i:05d}", state, attempt=0, node="n1", started_at=1.0 + i)
        for i in range(0, 1250, 250):
            w.job_progress(job, state="running", tasks_done=i)
        w.flush()
        stats = w.stats
    elapsed = time.perf_counter() - t0
    counter.remove()
    with capsys.disabled():
        print(f"\n[{db.dialect}] 5005 batched writes: {counter.count} commits, "
              f"{5005 / elapsed:,.0f} writes/s")
    # 5005 items at <= 500 per batch is >= 11 batches; the interval bound may split a few more.
    assert 11 <= counter.count <= 20
    assert stats.commits == counter.count and stats.items == 5005 and stats.failures == 0
    with db.read() as s:
        tasks = mdb.list_tasks(s, job)
        j = mdb.get_job(s, job)
    assert len(tasks) == 1250 and all(t.state == "done" and t.node == "n1" for t in tasks)
    assert tasks[7].started_at == 8.0
    assert (j.state, j.tasks_done) == ("running", 1000)


def test_a_lone_write_is_committed_within_the_interval(db: MetaDB) -> None:
    job = make_job(db, 1)
    commits = CommitCounter(db.engine)
    with BatchWriter(db, max_items=500, max_delay=0.05) as w:
        w.transition(job, "t00000", "dispatched")
        w.event(job, "task.running", task_id="t00000", stimulus_id="s1", payload={"n": 1})
        deadline = time.monotonic() + 5
        while w.stats.items < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.stats.items == 2 and commits.count == 1  # one commit for both, without flush()
    commits.remove()
    with db.read() as s:
        assert mdb.get_task(s, job, "t00000").state == "dispatched"
        assert [e.kind for e in mdb.list_events(s, job)] == ["task.running"]


def test_bad_input_is_refused_at_once_and_queues_nothing(db: MetaDB) -> None:
    job = make_job(db, 1)
    with BatchWriter(db) as w:
        with pytest.raises(mdb.UnknownJobError, match="j-missing"):
            w.event("j-missing", "x")
        with pytest.raises(mdb.UnknownTaskError, match="'t-missing'"):
            w.transition(job, "t-missing", "dispatched")
        with pytest.raises(mdb.InvalidInputError, match="unknown state"):
            w.transition(job, "t00000", "exploded")
        with pytest.raises(mdb.PayloadTooLargeError):
            w.event(job, "big", payload={"blob": "x" * 100_000})
        assert w.flush() == 0
    with pytest.raises(mdb.BatchWriteError, match="closed"):
        w.event(job, "late")


def test_a_failed_batch_is_kept_and_written_by_the_next_flush(db: MetaDB) -> None:
    job = make_job(db, 1)
    fail = {"armed": False}

    def refuse(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if fail["armed"] and statement.lstrip().upper().startswith("INSERT INTO EVENTS"):
            raise sa.exc.OperationalError(statement, {}, Exception("injected: database went away"))

    sa.event.listen(db.engine, "before_cursor_execute", refuse)
    try:
        # A long interval so that only explicit flushes write.
        with BatchWriter(db, max_items=500, max_delay=30) as w:
            w.transition(job, "t00000", "done")
            for i in range(3):
                w.event(job, "tick", payload={"i": i})
            fail["armed"] = True
            with pytest.raises(mdb.BatchWriteError, match="injected"):
                w.flush()
            with db.read() as s:  # the failed batch rolled back as a whole
                assert mdb.get_task(s, job, "t00000").state == "pending"
                assert mdb.list_events(s, job) == []
            fail["armed"] = False
            assert w.flush() == 4
            assert w.stats.failures == 1
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", refuse)
    with db.read() as s:
        assert mdb.get_task(s, job, "t00000").state == "done"
        assert [e.payload["i"] for e in mdb.list_events(s, job)] == [0, 1, 2]


def test_two_threads_share_one_writer_without_loss(db: MetaDB) -> None:
    job = make_job(db, 1)
    errors: list[BaseException] = []

    def produce(name: str, w: BatchWriter) -> None:
        try:
            for i in range(1000):
                w.event(job, "tick", stimulus_id=f"{name}-{i}", payload={"w": name, "i": i})
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    with BatchWriter(db, max_items=200, max_delay=0.02) as w:
        threads = [threading.Thread(target=produce, args=(n, w)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads) and errors == []
    with db.read() as s:
        events = mdb.list_events(s, job, limit=5000)
    for name in ("a", "b"):
        assert [e.payload["i"] for e in events if e.payload["w"] == name] == list(range(1000))


def test_bulk_transitions_and_tiles_are_written_in_few_commits(db: MetaDB) -> None:
    # The dispatcher's journal hands over a job's transitions and output tiles in bulk.
    job = make_job(db, 3000)
    commits = CommitCounter(db.engine)
    with BatchWriter(db, max_items=2000, max_delay=30) as w:
        w.transitions(job, [(f"t{i:05d}", "done", {"attempt": 0, "node": "n1", "finished_at": 2.0 + i})
                            for i in range(3000)])
        w.tiles(job, [mdb.TileLocation(f"t{i:05d}", (), (), "float32", 4, "n1") for i in range(3000)])
        w.tiles(job, [mdb.TileLocation("t00007", (0, 1), (2, 3), "float64", 48, "n2")])
        w.flush()
        assert (w.stats.items, w.stats.failures) == (6001, 0)
    commits.remove()
    assert 4 <= commits.count <= 8  # 6001 items, at most 2000 per batch (drained as they come)
    with db.read() as s:
        tasks = mdb.list_tasks(s, job)
        t7 = mdb.list_tiles(s, job, "t00007")
    assert all(t.state == "done" and t.node == "n1" for t in tasks)
    assert tasks[7].finished_at == 9.0
    assert [(t.index, t.shape, t.dtype, t.nbytes, t.node) for t in t7] == [
        ((), (), "float32", 4, "n1"), ((0, 1), (2, 3), "float64", 48, "n2")]
    # A tile reported again (recomputed elsewhere) replaces its row.
    with BatchWriter(db) as w:
        w.tiles(job, [mdb.TileLocation("t00007", (), (), "float32", 4, "n3")])
    with db.read() as s:
        assert [t.node for t in mdb.list_tiles(s, job, "t00007")] == ["n3", "n2"]


@pytest.mark.parametrize("bad", [
    ("t-missing", "done", {}),
    ("t00001", "exploded", {}),
    ("t00001", "done", {"attempt": -1}),
    ("t00001", "done", {"node": ""}),
    ("t00001", "done", {"finished_at": float("inf")}),
    ("t00001", "done", {"colour": "red"}),
])
def test_bulk_transitions_are_checked_and_queued_all_or_none(db: MetaDB, bad: tuple[str, str, dict]) -> None:
    job = make_job(db, 2)
    with BatchWriter(db, max_delay=30) as w:
        with pytest.raises((mdb.InvalidInputError, mdb.UnknownTaskError)):
            w.transitions(job, [("t00000", "done", {"node": "n1"}), bad])
        with pytest.raises(mdb.InvalidInputError):
            w.tiles(job, [mdb.TileLocation("t00000", (), (), "float32", 4, "n1"),
                          mdb.TileLocation("t00001", (), (), "float32", -4, "n1")])
        with pytest.raises(mdb.UnknownJobError):
            w.tiles("j-missing", [mdb.TileLocation("t00000", (), (), "float32", 4, "n1")])
        assert w.flush() == 0
    with db.read() as s:
        assert [t.state for t in mdb.list_tasks(s, job)] == ["pending", "pending"]
        assert mdb.list_tiles(s, job, "t00000") == []


def test_a_job_taken_as_known_is_written_without_checking_queries(db: MetaDB) -> None:
    job = make_job(db, 2)
    selects: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(statement)

    sa.event.listen(db.engine, "before_cursor_execute", count)
    try:
        with BatchWriter(db, max_items=500, max_delay=0.05) as w:
            w.known(job, ["t00000", "t00001"])  # as the scheduler does once it stored the rows
            w.transitions(job, [("t00000", "done", {"node": "n1"}), ("t00001", "done", {"node": "n2"})])
            w.job_progress(job, state="done", tasks_done=2)
            checked = list(selects)
            w.flush()
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", count)
    assert checked == []
    with db.read() as s:
        assert [(t.state, t.node) for t in mdb.list_tasks(s, job)] == [("done", "n1"), ("done", "n2")]
        assert mdb.get_job(s, job).state == "done"
    # without it, the first write of a job checks its rows exist
    with BatchWriter(db, max_items=500, max_delay=0.05) as w:
        sa.event.listen(db.engine, "before_cursor_execute", count)
        try:
            w.transition(job, "t00000", "done", node="n1")
        finally:
            sa.event.remove(db.engine, "before_cursor_execute", count)
    assert len(selects) >= 1


def test_the_ids_taken_as_known_are_a_bounded_cache(db: MetaDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer keeps the last KNOWN_JOBS jobs' ids (a scheduler that ran 10^5 steps holds
    no 10^5 of them); a job evicted from it is checked by a query at its next write, and
    written as before."""
    from triplane.metadb import batch

    monkeypatch.setattr(batch, "KNOWN_JOBS", 3)
    jobs = [make_job(db, 1) for _ in range(5)]
    with BatchWriter(db, max_items=500, max_delay=0.05) as w:
        for job in jobs:
            w.known(job, ["t00000"])
        assert [w.knows(j) for j in jobs] == [False, False, True, True, True]
        for job in jobs:
            w.transition(job, "t00000", "done", node="n1")  # the first two: checked again
        assert [w.knows(j) for j in jobs] == [False, False, True, True, True]  # still the last three
        w.flush()
    with db.read() as s:
        assert all(mdb.list_tasks(s, j)[0].state == "done" for j in jobs)


def _new_rows(job: str, graph: bytes = GRAPH) -> mdb.JobRows:
    return mdb.job_rows(graph_hash="h-new", graph_json=graph, fetch=["x"], job_id=job, state="running",
                        now=1.0, tasks=[NewTask("a", "noop"), NewTask("b", "noop", "pending")],
                        events=[mdb.NewEvent(job, "job.bindings", at=1.0, payload={"args": []})])


def test_new_jobs_are_inserted_with_their_batch_before_its_writes(db: MetaDB) -> None:
    """Steps' rows queued with their transitions, progress and events: one commit for all,
    the same rows as insert_job and the writes after it."""
    counter = CommitCounter(db.engine)
    with BatchWriter(db, max_items=500, max_delay=5.0) as w:
        for j in ("j-new-1", "j-new-2", "j-new-3"):
            w.new_job(_new_rows(j))
            assert w.knows(j) and w.inserting(j)
            w.transitions(j, [("a", "done", {"node": "n1"}), ("b", "done", {"node": "n2"})])
            w.job_progress(j, state="done", tasks_done=2)
            w.event(j, "job.released")
        w.flush()
        assert not any(w.inserting(j) for j in ("j-new-1", "j-new-2", "j-new-3"))
    counter.remove()
    assert counter.count == 1
    with db.read() as s:
        for j in ("j-new-1", "j-new-2", "j-new-3"):
            info = mdb.get_job(s, j)
            assert (info.state, info.tasks_total, info.tasks_done) == ("done", 2, 2)
            assert [(t.task_id, t.state, t.node) for t in mdb.list_tasks(s, j)] == [
                ("a", "done", "n1"), ("b", "done", "n2")]
            assert [e.kind for e in mdb.list_events(s, j)] == ["job.bindings", "job.released"]


def test_new_job_rows_are_checked_when_built_and_a_conflict_drops_its_batch(db: MetaDB) -> None:
    with pytest.raises(mdb.InvalidInputError):
        mdb.job_rows(graph_hash="h-new", graph_json=GRAPH, fetch="x", job_id="j-bad", now=1.0, tasks=[])
    with pytest.raises(mdb.InvalidInputError):
        _new_rows("bad\x00id")
    with BatchWriter(db, max_items=500, max_delay=5.0) as w:
        w.new_job(_new_rows("j-once"))
        w.flush()
        w.new_job(_new_rows("j-once"))  # the same id again: a conflict, not retried
        with pytest.raises(mdb.BatchWriteError, match="dropped"):
            w.flush()
        assert not w.inserting("j-once")
        assert w.stats.failures == 1
        w.new_job(_new_rows("j-after"))  # the writer goes on
        w.flush()
    with db.read() as s:
        assert mdb.get_job(s, "j-after").tasks_total == 2


def test_a_stored_graph_is_written_once_for_many_new_jobs_until_retention_forgets(db: MetaDB) -> None:
    """Steps of one graph: its row is inserted (and checked) by the first new_job only; after
    ``forget`` (retention deleted jobs, maybe the graph) the next one writes it again."""
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "graphs" in statement:
            statements.append(statement.split()[0].upper())

    sa.event.listen(db.engine, "before_cursor_execute", seen)
    try:
        with BatchWriter(db, max_items=500, max_delay=5.0) as w:
            for i in range(3):
                w.new_job(_new_rows(f"j-g{i}"))
                w.flush()
            assert statements == ["INSERT"]
            with db.transaction() as s:  # retention: every job of the graph, and the graph
                s.execute(sa.text("DELETE FROM events")), s.execute(sa.text("DELETE FROM tasks"))
                s.execute(sa.text("DELETE FROM jobs")), s.execute(sa.text("DELETE FROM graphs"))
            w.forget(["j-g0", "j-g1", "j-g2"])
            w.new_job(_new_rows("j-g3"))
            w.flush()
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", seen)
    assert statements.count("INSERT") == 2
    with db.read() as s:
        assert mdb.get_job(s, "j-g3").tasks_total == 2 and mdb.get_graph(s, "h-new").canonical == GRAPH


@pytest.mark.parametrize("n", [1, 7, 9000])
def test_update_many_writes_every_row_and_only_those(db: MetaDB, n: int) -> None:
    """``fast.update_many`` (many rows per ``UPDATE ... FROM (VALUES ...)``, chunked by the
    bind limit) sets each row's columns by its key, NULLs included, and leaves the others."""
    import random

    from triplane.metadb.fast import update_many
    from triplane.metadb.models import Task

    job = make_job(db, n + 3)
    rng = random.Random(n)
    want = {f"t{i:05d}": (rng.choice(["ready", "done"]), rng.randrange(4), rng.choice([None, f"n{i}"]),
                          rng.choice([None, rng.uniform(0, 1e9)])) for i in rng.sample(range(n + 3), n)}
    with db.engine.begin() as conn:
        update_many(conn, Task.__table__, ("state", "attempt", "node", "started_at"), ("job_id", "task_id"),
                    [(*v, job, t) for t, v in want.items()])
    with db.read() as s:
        got = {t.task_id: t for t in mdb.list_tasks(s, job)}
    assert len(got) == n + 3
    for tid, t in got.items():
        if tid in want:
            assert (t.state, t.attempt, t.node, t.started_at) == want[tid], tid
        else:
            assert (t.state, t.attempt, t.node, t.started_at) == ("pending", 0, None, None), tid
