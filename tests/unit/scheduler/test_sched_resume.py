"""A restarted scheduler resumes a job from metadb: a task recorded done on a live executor
starts done (its row names the node holding its output), the rest run again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from triplane import metadb as mdb
from triplane.registry import MemoryBackend
from triplane.scheduler.service import Scheduler


def chain() -> dict:
    """normal -> neg -> neg, every node an output: three tasks (random sources are never
    folded, outputs are never fused away)."""
    nodes = {"c0": {"op": "normal", "shape": [2], "dtype": "float32",
                    "attrs": {"seed": 1, "shape": [2], "dtype": "float32"}},
             "c1": {"op": "neg", "inputs": ["c0"], "shape": [2], "dtype": "float32"},
             "c2": {"op": "neg", "inputs": ["c1"], "shape": [2], "dtype": "float32"}}
    return {"version": 1, "nodes": nodes, "outputs": ["c0", "c1", "c2"]}


def test_resume_counts_tasks_done_on_live_nodes_from_their_rows(tmp_path: Path) -> None:
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    first = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)
    cgraph, args, plan = first._plan(chain(), ["c2"], [])
    first._store_job(plan, cgraph, ["c2"], {"args": list(args), "fetch": dict(plan.fetch)}, time.time())
    a, b, c = (t.id for t in plan.specs)  # in dataflow order
    assert [t.deps for t in plan.specs] == [(), (a,), (b,)]
    with db.transaction() as s:  # what the first scheduler's journal wrote before it died
        mdb.transition_task(s, plan.job, a, "done", node="ex0", attempt=0)
        mdb.transition_task(s, plan.job, b, "done", node="ex-gone", attempt=0)

    second = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)

    async def resume() -> dict[str, tuple[str, str | None]]:
        await second._resume({"ex0"})
        return {tid: (t.state, t.node) for tid, t in second.state.jobs[plan.job].tasks.items()}

    tasks = asyncio.run(resume())
    # a's output is on a live node; b's node is gone, so b runs again (and c after it).
    assert tasks == {a: ("done", "ex0"), b: ("ready", None), c: ("pending", None)}
