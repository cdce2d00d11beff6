"""The repository functions, the same suite on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading

import pytest

from triplane import metadb as mdb
from triplane.metadb import MetaDB, NewEvent, NewTask, TileLocation

GRAPH = json.dumps({"nodes": {"x": {"op": "input"}, "y": {"op": "relu", "inputs": ["x"]}},
                    "outputs": ["y"], "version": 1}, sort_keys=True, separators=(",", ":")).encode()
H = "sha256-" + "ab" * 16


def make_job(db: MetaDB, n_tasks: int = 3, **kw: object) -> str:
    with db.transaction() as s:
        job = mdb.create_job(s, graph_hash=H, graph_json=GRAPH, fetch=["y"], **kw)  # type: ignore[arg-type]
        mdb.insert_tasks(s, job.id, [NewTask(f"t{i}", "relu", predicted_s=0.01) for i in range(n_tasks)])
    return job.id


def test_create_and_get_job_dedups_the_graph(db: MetaDB) -> None:
    a = make_job(db, owner="tok-1")
    b = make_job(db)
    with db.read() as s:
        ja, jb = mdb.get_job(s, a), mdb.get_job(s, b)
        g = mdb.get_graph(s, H)
    assert ja.state == "submitted" and ja.fetch == ("y",) and ja.owner == "tok-1"
    assert ja.tasks_total == 3 and ja.tasks_done == 0
    assert ja.graph_hash == jb.graph_hash == H and a != b
    assert g.canonical == GRAPH and g.node_count == 2


def test_same_hash_with_other_bytes_is_a_conflict(db: MetaDB) -> None:
    make_job(db)
    with pytest.raises(mdb.ConflictError, match="different bytes"), db.transaction() as s:
        mdb.create_job(s, graph_hash=H, graph_json=GRAPH.replace(b"relu", b"tanh"), fetch=[])
    with db.read() as s:
        assert len(mdb.list_jobs(s)) == 1  # the failed create left nothing behind


def test_list_jobs_newest_first_and_filtered(db: MetaDB) -> None:
    ids = []
    for i in range(4):
        with db.transaction() as s:
            ids.append(mdb.create_job(s, graph_hash=H, graph_json=GRAPH, fetch=[], now=100.0 + i).id)
    with db.transaction() as s:
        mdb.set_job_state(s, ids[1], "done")
    with db.read() as s:
        assert [j.id for j in mdb.list_jobs(s)] == ids[::-1]
        assert [j.id for j in mdb.list_jobs(s, limit=2)] == ids[:1:-1]
        assert [j.id for j in mdb.list_jobs(s, states=["done"])] == [ids[1]]


def test_job_state_and_progress_persist_across_sessions(db: MetaDB) -> None:
    job = make_job(db)
    with db.transaction() as s:
        mdb.set_job_state(s, job, "running", tasks_done=2, tasks_failed=1)
    with db.transaction() as s, pytest.raises(mdb.ConflictError, match="'running', not 'compiling'"):
        mdb.set_job_state(s, job, "done", expect="compiling")
    with db.transaction() as s:
        mdb.set_job_state(s, job, "failed", expect="running", error="kernel raised: x" * 5000)
    with db.read() as s:
        j = mdb.get_job(s, job)
    assert (j.state, j.tasks_done, j.tasks_failed) == ("failed", 2, 1)
    assert j.error is not None and j.error.startswith("kernel raised") and len(j.error) <= 8192


def test_plans_upsert_by_graph_and_structure(db: MetaDB) -> None:
    job = make_job(db)
    with db.transaction() as s:
        p1 = mdb.upsert_plan(s, graph_hash=H, structure_hash="s1", plan={"tasks": [1]},
                             predicted_makespan=2.5)
        p2 = mdb.upsert_plan(s, graph_hash=H, structure_hash="s1", plan={"tasks": [1, 2]},
                             predicted_makespan=3.0)
        mdb.upsert_plan(s, graph_hash=H, structure_hash="s2", plan={"tasks": []})
        mdb.set_job_state(s, job, "running", plan_id=p1.id)
    with db.read() as s:
        got = mdb.get_plan(s, H, "s1")
        assert mdb.get_plan(s, H, "nope") is None
        assert mdb.get_job(s, job).plan_id == p1.id
    assert got is not None and p2.id == p1.id
    assert got.plan == {"tasks": [1, 2]} and got.predicted_makespan == 3.0


def test_task_transitions_persist_with_timings_and_errors(db: MetaDB) -> None:
    job = make_job(db)
    with db.transaction() as s:
        mdb.transition_task(s, job, "t0", "dispatched", attempt=0, node="n1", queued_at=10.0)
        mdb.transition_task(s, job, "t0", "done", expect="dispatched", started_at=10.5, finished_at=11.0,
                            actual_s=0.5)
        mdb.transition_task(s, job, "t1", "failed", error_kind="user", error_message="boom")
    # a late reply of an old attempt must not overwrite a finished task
    with db.transaction() as s, pytest.raises(mdb.ConflictError, match="'done', not 'dispatched'"):
        mdb.transition_task(s, job, "t0", "failed", expect="dispatched")
    with db.read() as s:
        t0, t1 = mdb.get_task(s, job, "t0"), mdb.get_task(s, job, "t1")
        assert [t.task_id for t in mdb.list_tasks(s, job, states=["pending"])] == ["t2"]
    assert (t0.state, t0.node, t0.queued_at, t0.started_at, t0.finished_at, t0.actual_s) == (
        "done", "n1", 10.0, 10.5, 11.0, 0.5)
    assert t0.predicted_s == 0.01
    assert (t1.state, t1.error_kind, t1.error_message) == ("failed", "user", "boom")


def test_tiles_are_upserted_and_listed_in_index_order(db: MetaDB) -> None:
    job = make_job(db)
    tiles = [TileLocation("y", (i, j), (32, 32), "float32", 4096, node="n1", memory_engine="host")
             for i in (10, 2) for j in (0, 1)]
    with db.transaction() as s:
        assert mdb.record_tiles(s, job, tiles) == 4
        # the tile moved to n2 (recomputed elsewhere)
        mdb.record_tiles(s, job, [TileLocation("y", (2, 1), (32, 32), "float32", 4096, node="n2")])
        assert mdb.mark_node_tiles_lost(s, "n1") == 3
    with db.read() as s:
        got = mdb.list_tiles(s, job, "y")
        assert mdb.list_tiles(s, job, "other") == []
    assert [t.index for t in got] == [(2, 0), (2, 1), (10, 0), (10, 1)]
    assert [(t.node, t.state) for t in got] == [("n1", "lost"), ("n2", "present"),
                                                 ("n1", "lost"), ("n1", "lost")]
    assert got[0].shape == (32, 32) and got[0].nbytes == 4096


def test_events_append_and_page(db: MetaDB) -> None:
    job = make_job(db)
    with db.transaction() as s:
        mdb.add_events(s, [NewEvent(job, "task.ready", task_id=f"t{i % 3}", stimulus_id=f"s{i}",
                                    at=float(i), payload={"i": i}) for i in range(10)])
    with db.read() as s:
        first = mdb.list_events(s, job, limit=4)
        rest = mdb.list_events(s, job, after_id=first[-1].id)
        of_t1 = mdb.list_events(s, job, task_id="t1")
    assert [e.payload["i"] for e in first + rest] == list(range(10))
    assert [e.stimulus_id for e in of_t1] == ["s1", "s4", "s7"]


def test_resume_after_restart_sees_unfinished_jobs_with_tasks(db_url: str) -> None:
    first = mdb.open_db(db_url)
    running, done = make_job(first, 4), make_job(first, 2)
    with first.transaction() as s:
        mdb.set_job_state(s, running, "running")
        mdb.set_job_state(s, done, "done")
        mdb.transition_task(s, running, "t0", "done", attempt=0, node="n1")
        mdb.transition_task(s, running, "t1", "dispatched", attempt=1, node="n2")
    first.close()  # the "scheduler" stops; a new process opens the same URL

    second = mdb.open_db(db_url)
    try:
        with second.read() as s:
            resume = mdb.jobs_to_resume(s)
    finally:
        second.close()
    assert [r.job.id for r in resume] == [running]
    states = {t.task_id: (t.state, t.attempt, t.node) for t in resume[0].tasks}
    assert states == {"t0": ("done", 0, "n1"), "t1": ("dispatched", 1, "n2"),
                      "t2": ("pending", 0, None), "t3": ("pending", 0, None)}


def test_unknown_ids_raise_clear_errors(db: MetaDB) -> None:
    job = make_job(db)
    with db.read() as s:
        with pytest.raises(mdb.UnknownJobError, match="unknown job id 'j-missing'"):
            mdb.get_job(s, "j-missing")
        with pytest.raises(mdb.UnknownJobError):
            mdb.list_tasks(s, "j-missing")
        with pytest.raises(mdb.UnknownTaskError, match="unknown task 'nope' of job"):
            mdb.get_task(s, job, "nope")
    with pytest.raises(mdb.UnknownTaskError), db.transaction() as s:
        mdb.transition_task(s, job, "nope", "dispatched")
    with pytest.raises(mdb.UnknownJobError), db.transaction() as s:
        mdb.add_events(s, [NewEvent(job, "ok"), NewEvent("j-missing", "x")])
    with db.read() as s:
        assert mdb.list_events(s, job) == []  # the batch with a bad event wrote nothing


@pytest.mark.parametrize("bad", [
    {"state": "exploded"},
    {"attempt": -1},
    {"node": "n" * 500},
    {"started_at": float("nan")},
    {"error_kind": "cosmic"},
    {"colour": "red"},
])
def test_bad_task_fields_are_rejected_and_nothing_changes(db: MetaDB, bad: dict[str, object]) -> None:
    job = make_job(db)
    bad = dict(bad)  # the parameter dict is shared between the backends' runs
    state = bad.pop("state", "dispatched")
    with pytest.raises(mdb.InvalidInputError), db.transaction() as s:
        mdb.transition_task(s, job, "t0", str(state), **bad)
    with db.read() as s:
        assert mdb.get_task(s, job, "t0").state == "pending"


def test_oversized_and_non_json_payloads_are_rejected(db: MetaDB) -> None:
    job = make_job(db)
    with pytest.raises(mdb.PayloadTooLargeError, match="at most 65536"), db.transaction() as s:
        mdb.add_events(s, [NewEvent(job, "big", payload={"blob": "x" * 70_000})])
    with pytest.raises(mdb.InvalidInputError, match="JSON"), db.transaction() as s:
        mdb.add_events(s, [NewEvent(job, "weird", payload={"x": object()})])
    with pytest.raises(mdb.InvalidInputError), db.transaction() as s:
        mdb.add_events(s, [NewEvent(job, "nan", payload={"x": float("inf")})])
    with pytest.raises(mdb.InvalidInputError, match="not UTF-8 JSON"), db.transaction() as s:
        mdb.create_job(s, graph_hash="h2", graph_json=b"\xff\x00", fetch=[])
    with pytest.raises(mdb.PayloadTooLargeError), db.transaction() as s:
        mdb.create_job(s, graph_hash=H, graph_json=GRAPH, fetch=["y"] * 10_001)
    with db.read() as s:
        assert mdb.list_events(s, job) == [] and len(mdb.list_jobs(s)) == 1


def test_duplicate_tasks_are_a_conflict(db: MetaDB) -> None:
    job = make_job(db, 2)
    with pytest.raises(mdb.ConflictError, match=r"'t1'.*already exists"), db.transaction() as s:
        mdb.insert_tasks(s, job, [NewTask("t9", "relu"), NewTask("t1", "relu")])
    with pytest.raises(mdb.ConflictError, match="twice"), db.transaction() as s:
        mdb.insert_tasks(s, job, [NewTask("t7", "relu"), NewTask("t7", "relu")])
    with db.read() as s:
        assert [t.task_id for t in mdb.list_tasks(s, job)] == ["t0", "t1"]
        assert mdb.get_job(s, job).tasks_total == 2


def test_two_threads_writing_events_lose_nothing(db: MetaDB) -> None:
    job = make_job(db, 1)
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            for i in range(50):
                with db.transaction() as s:
                    mdb.add_events(s, [NewEvent(job, "tick", stimulus_id=f"{name}-{i}",
                                                payload={"w": name, "i": i})])
                    mdb.transition_task(s, job, "t0", "dispatched", attempt=i)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and errors == []
    with db.read() as s:
        events = mdb.list_events(s, job)
        assert mdb.get_task(s, job, "t0").attempt == 49
    for name in ("a", "b"):  # each writer's events are all there, in its own order
        assert [e.payload["i"] for e in events if e.payload["w"] == name] == list(range(50))


@pytest.mark.parametrize("bad", [
    NewTask("", "relu"),
    NewTask("t5", ""),
    NewTask("t5", "relu", state="exploded"),
    NewTask("t5", "relu", node="n" * 500),
    NewTask("t5", "relu", predicted_s=float("inf")),
    NewTask("t5", "relu", predicted_s=float("nan")),
    NewTask("t5", "relu", predicted_s="1.0"),  # type: ignore[arg-type]
])
def test_insert_tasks_checks_every_field_and_inserts_nothing(db: MetaDB, bad: NewTask) -> None:
    job = make_job(db, 1)
    with pytest.raises(mdb.InvalidInputError), db.transaction() as s:
        mdb.insert_tasks(s, job, [NewTask("t4", "relu", predicted_s=2), bad])
    with db.transaction() as s:  # an int prediction is stored as seconds (a float)
        mdb.insert_tasks(s, job, [NewTask("t4", "relu", predicted_s=2, node="n1")])
    with db.read() as s:
        assert [(t.task_id, t.predicted_s, t.node) for t in mdb.list_tasks(s, job)] == [
            ("t0", 0.01, None), ("t4", 2.0, "n1")]


def test_insert_job_stores_what_create_job_insert_tasks_and_add_events_do(db: MetaDB) -> None:
    """The submit path's few-statement store: the same job, tasks, event and graph rows as
    the ORM functions, and the same conflicts (a job id in use, a graph hash with other bytes)."""
    orm = make_job(db, n_tasks=2, owner="tok-1")
    with db.transaction() as s:
        mdb.insert_job(s, graph_hash=H, graph_json=GRAPH, fetch=["y"], owner="tok-1", job_id="j-fast",
                       state="running", now=123.5, node_count=2,
                       tasks=[NewTask("t0", "relu", "ready", predicted_s=0.01), NewTask("t1", "relu")],
                       events=[NewEvent("j-fast", "job.bindings", at=123.5, payload={"args": ["u-1"]})])
    with db.read() as s:
        fast, slow = mdb.get_job(s, "j-fast"), mdb.get_job(s, orm)
        tasks = mdb.list_tasks(s, "j-fast")
        (ev,) = mdb.list_events(s, "j-fast")
        resumable = {r.job.id: r for r in mdb.jobs_to_resume(s)}
    assert (fast.state, fast.fetch, fast.owner, fast.tasks_total, fast.created_at) == \
        ("running", ("y",), "tok-1", 2, 123.5)
    assert (fast.graph_hash, fast.name, fast.tags, fast.error) == (slow.graph_hash, None, (), None)
    assert [(t.task_id, t.state, t.predicted_s) for t in tasks] == \
        [("t0", "ready", 0.01), ("t1", "pending", None)]
    assert (ev.kind, ev.payload, ev.at) == ("job.bindings", {"args": ["u-1"]}, 123.5)
    assert [t.task_id for t in resumable["j-fast"].tasks] == ["t0", "t1"]  # a restart resumes it
    with pytest.raises(mdb.ConflictError, match="already exists"), db.transaction() as s:
        mdb.insert_job(s, graph_hash=H, graph_json=GRAPH, fetch=[], tasks=[], job_id="j-fast", now=1.0)
    with pytest.raises(mdb.ConflictError, match="different bytes"), db.transaction() as s:
        mdb.insert_job(s, graph_hash=H, graph_json=GRAPH.replace(b"relu", b"tanh"), fetch=[], tasks=[],
                       job_id="j-other", now=1.0)
    with pytest.raises(mdb.ConflictError, match="appears twice"), db.transaction() as s:
        mdb.insert_job(s, graph_hash=H, graph_json=GRAPH, fetch=[], job_id="j-twice", now=1.0,
                       tasks=[NewTask("t0", "relu"), NewTask("t0", "relu")])
    with pytest.raises(mdb.UnknownJobError), db.transaction() as s:
        mdb.insert_job(s, graph_hash=H, graph_json=GRAPH, fetch=[], tasks=[], job_id="j-ev", now=1.0,
                       events=[NewEvent("j-elsewhere", "job.bindings")])
    with db.read() as s:
        assert sorted(j.id for j in mdb.list_jobs(s)) == sorted([orm, "j-fast"])  # failures left nothing
