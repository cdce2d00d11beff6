"""A scheduler that steps down keeps its finished jobs fetchable and forgets the rest."""

from __future__ import annotations

import asyncio
from pathlib import Path

from triplane import metadb as mdb
from triplane.proto.builder import Builder
from triplane.registry import MemoryBackend
from triplane.scheduler.compiler.compile import compile_job
from triplane.scheduler.compiler.pipeline import PlanCache
from triplane.scheduler.livejob import LiveJob
from triplane.scheduler.service import Scheduler


def _plan(job: str):  # type: ignore[no-untyped-def]
    b = Builder()
    y = b.add_node("full", [], {"value": 1.0, "shape": (2,), "dtype": "float32"}, node_id="y")
    return compile_job(b.graph([y]), ["y"], cache=PlanCache(), job=job)


def test_step_down_keeps_done_jobs_and_their_holders(tmp_path: Path) -> None:
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)
    done = LiveJob(_plan("j" + "1" * 16), {}, 0.0, 0.0, state="done", holders={"n0": "executor-0"})
    running = LiveJob(_plan("j" + "2" * 16), {}, 0.0, 0.0)
    s.jobs.live.update({"j" + "1" * 16: done, "j" + "2" * 16: running})
    asyncio.run(s._step_down())
    assert list(s.jobs.live) == ["j" + "1" * 16]
    assert s.jobs.live["j" + "1" * 16].holders == {"n0": "executor-0"}
    assert done.ended.is_set() and running.ended.is_set()  # long-pollers re-read either way
