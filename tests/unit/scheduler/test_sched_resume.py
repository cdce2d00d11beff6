"""A restarted scheduler resumes a job from metadb: a task recorded done on a live executor
starts done (its row names the node holding its output), the rest run again. It waits
(bounded) for the executors its done rows name to register again before it counts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from triplane import metadb as mdb
from triplane.registry import MemoryBackend, NodeInfo
from triplane.scheduler.compiler.compile import ClusterSnapshot
from triplane.scheduler.service import Scheduler


def chain() -> dict:
    """normal -> neg -> neg, every node an output: three tasks (random sources are never
    folded, outputs are never fused away)."""
    nodes = {"c0": {"op": "normal", "shape": [2], "dtype": "float32",
                    "attrs": {"seed": 1, "shape": [2], "dtype": "float32"}},
             "c1": {"op": "neg", "inputs": ["c0"], "shape": [2], "dtype": "float32"},
             "c2": {"op": "neg", "inputs": ["c1"], "shape": [2], "dtype": "float32"}}
    return {"version": 1, "nodes": nodes, "outputs": ["c0", "c1", "c2"]}


def stored(tmp_path: Path) -> tuple[mdb.MetaDB, str, tuple[str, str, str]]:
    """A three-task job stored by a first scheduler, its first task done on ``ex0`` and
    its second on ``ex-gone``: (the metadb, the job, its task ids in dataflow order)."""
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    first = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32,
                      group_tiny_jobs=False)  # one task per node: resume counts them
    plan = first.jobs.compile(chain(), ["c2"], ClusterSnapshot())
    first.jobs.store_job(plan, ["c2"], {"args": list(plan.args), "fetch": dict(plan.fetch)}, time.time())
    a, b, c = (t.id for t in plan.specs)  # in dataflow order
    assert [t.deps for t in plan.specs] == [(), (a,), (b,)]
    with db.transaction() as s:  # what the first scheduler's journal wrote before it died
        mdb.transition_task(s, plan.job, a, "done", node="ex0", attempt=0)
        mdb.transition_task(s, plan.job, b, "done", node="ex-gone", attempt=0)
    return db, plan.job, (a, b, c)


def test_resume_counts_tasks_done_on_live_nodes_from_their_rows(tmp_path: Path) -> None:
    db, job, (a, b, c) = stored(tmp_path)
    second = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)

    async def resume() -> dict[str, tuple[str, str | None]]:
        await second.jobs.resume(await asyncio.to_thread(second.jobs.load_resumable), {"ex0"})
        return {tid: (t.state, t.node) for tid, t in second.state.jobs[job].tasks.items()}

    tasks = asyncio.run(resume())
    # a's output is on a live node; b's node is gone, so b runs again (and c after it).
    assert tasks == {a: ("done", "ex0"), b: ("ready", None), c: ("pending", None)}


def node(name: str) -> NodeInfo:
    return NodeInfo(name, "127.0.0.1", 1, 1, 1, "0", 0.0, 1)


def test_resume_waits_for_the_executors_its_done_rows_name(tmp_path: Path) -> None:
    """The executors re-register after the scheduler leads (the memory registry it serves
    starts empty): resume waits for them, so a task done on ``ex0`` stays done."""
    db, job, (a, b, c) = stored(tmp_path)
    second = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32,
                       resume_wait_s=0.8)

    async def resume() -> tuple[dict[str, tuple[str, str | None]], float]:
        started = time.monotonic()
        task = asyncio.get_running_loop().create_task(second._resume())
        await asyncio.sleep(0.2)
        assert job not in second.jobs.live  # still waiting for ex0 and ex-gone
        second.shell.nodes["ex0"] = node("ex0")  # ex0 registers again; ex-gone never does
        await task
        tasks = {tid: (t.state, t.node) for tid, t in second.state.jobs[job].tasks.items()}
        return tasks, time.monotonic() - started

    tasks, took = asyncio.run(resume())
    assert tasks == {a: ("done", "ex0"), b: ("ready", None), c: ("pending", None)}
    assert 0.8 <= took < 3.0  # bounded: ex-gone is waited for at most resume_wait_s


def test_resume_does_not_wait_when_every_named_executor_is_there(tmp_path: Path) -> None:
    db, job, (a, b, c) = stored(tmp_path)
    second = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32,
                       resume_wait_s=30.0)
    second.shell.nodes.update({"ex0": node("ex0"), "ex-gone": node("ex-gone")})

    async def resume() -> float:
        started = time.monotonic()
        await second._resume()
        return time.monotonic() - started

    assert asyncio.run(resume()) < 5.0
    tasks = {tid: t.state for tid, t in second.state.jobs[job].tasks.items()}
    assert tasks == {a: "done", b: "done", c: "ready"}


def test_a_resumed_job_keeps_the_deadline_it_was_submitted_with(tmp_path: Path) -> None:
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    first = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32,
                      group_tiny_jobs=False)  # one task per node: resume counts them
    plan = first.jobs.compile(chain(), ["c2"], ClusterSnapshot())
    submitted = time.time() - 5.0
    bindings = {"args": list(plan.args), "fetch": dict(plan.fetch), "deadline_s": 60.0}
    first.jobs.store_job(plan, ["c2"], bindings, submitted)
    second = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)

    async def resume() -> float | None:
        await second.jobs.resume(await asyncio.to_thread(second.jobs.load_resumable), set())
        return second.state.jobs[plan.job].deadline

    deadline = asyncio.run(resume())
    assert deadline is not None and abs(deadline - (submitted + 60.0)) < 1e-3  # from submit, not resume


def test_a_job_whose_held_inline_input_is_gone_fails_at_resume_naming_it(tmp_path: Path) -> None:
    """A compiled step's inline input is held in the scheduler's memory only: a restarted
    scheduler cannot run the job again, so it fails it with a message naming the input."""
    import numpy as np

    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    first = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)
    u = first.store.put(np.ones((2, 2), np.float32).tobytes(), (2, 2), "float32", held=True).id
    doc = {"version": 1, "nodes": {
        "x": {"op": "input", "shape": [2, 2], "dtype": "float32",
              "attrs": {"tensor": u, "shape": [2, 2], "dtype": "float32"}},
        "y": {"op": "exp", "inputs": ["x"], "shape": [2, 2], "dtype": "float32"}}, "outputs": ["y"]}
    plan = first.jobs.compile(doc, ["y"], ClusterSnapshot())
    first.jobs.store_job(plan, ["y"], {"args": list(plan.args), "fetch": dict(plan.fetch)}, time.time())
    second = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)

    async def resume() -> None:
        await second.jobs.resume(await asyncio.to_thread(second.jobs.load_resumable), set())

    asyncio.run(resume())
    assert plan.job not in second.jobs.live
    with db.read() as s:
        info = mdb.get_job(s, plan.job)
    assert info.state == "failed" and f"cannot resume: its input {u} is gone" in (info.error or "")


def test_a_job_reading_another_jobs_tile_is_not_failed_as_a_lost_upload(tmp_path: Path) -> None:
    """The resume check for lost inline inputs looks at uploads only: an input bound to
    another job's tile (a ref) is reattached as before, not taken for a lost upload."""
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    first = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)
    tile = "j00000000000000aa.n1"
    doc = {"version": 1, "nodes": {
        "x": {"op": "input", "shape": [2, 2], "dtype": "float32",
              "attrs": {"tensor": tile, "shape": [2, 2], "dtype": "float32"}},
        "y": {"op": "exp", "inputs": ["x"], "shape": [2, 2], "dtype": "float32"}}, "outputs": ["y"]}
    plan = first.jobs.compile(doc, ["y"], ClusterSnapshot())
    assert list(plan.uploads.values()) == [tile]
    first.jobs.store_job(plan, ["y"], {"args": list(plan.args), "fetch": dict(plan.fetch)}, time.time())
    second = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)

    async def resume() -> None:
        await second.jobs.resume(await asyncio.to_thread(second.jobs.load_resumable), set())

    asyncio.run(resume())
    assert plan.job in second.jobs.live
    with db.read() as s:
        assert mdb.get_job(s, plan.job).state == "running"
