"""Finished jobs leave the scheduler's memory: after 5,000 small jobs the scheduler holds no
more per-job state than after 500, and its RSS has not grown by more than 10%.

An in-process Scheduler (started: packet and data ports on loopback, the in-memory
registry, a SQLite metadb) runs the jobs on a fake executor: a UDP endpoint that answers
every signed task packet with a successful reply, as an executor would, without running a
kernel. Jobs finished long enough ago are served from the metadb (status, plan)."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path
from typing import Any

import pytest

from triplane import metadb as mdb
from triplane.process import limit_malloc_arenas
from triplane.proto.packet import PacketError, Reply, TileInfo, Timings, decode_task, encode_reply
from triplane.registry import MemoryBackend, MemoryEngineInfo, NodeInfo, OpEngineInfo
from triplane.registry.records import encode
from triplane.scheduler import jobs
from triplane.scheduler.compiler.compile import compile_job
from triplane.scheduler.jobrecords import bindings_of
from triplane.scheduler.livejob import LiveJob
from triplane.scheduler.service import Scheduler

SECRET = b"s" * 32
RETAIN = 16


class FakeExecutor(asyncio.DatagramProtocol):
    """Answers each task packet with ``ok`` and one 8-byte float32 output."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.ran = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            p = decode_task(data, SECRET)
        except PacketError:
            return
        self.ran += 1
        now = time.time()
        out = TileInfo(p.outputs[0], (2,), "float32", 8)
        reply = Reply(p.task, True, Timings(now, now, now + 1e-5), (out,))
        assert self.transport is not None
        self.transport.sendto(encode_reply(reply, SECRET), addr)


def job_doc(seed: int) -> dict[str, Any]:
    """normal -> neg -> exp: two tasks (a random source is never folded away)."""
    attrs = {"seed": seed, "shape": [2], "dtype": "float32"}
    nodes = {"x": {"op": "normal", "shape": [2], "dtype": "float32", "attrs": attrs},
             "y": {"op": "neg", "inputs": ["x"], "shape": [2], "dtype": "float32"},
             "z": {"op": "exp", "inputs": ["y"], "shape": [2], "dtype": "float32"}}
    return {"version": 1, "nodes": nodes, "outputs": ["z"]}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_job_sizes(s: Scheduler) -> dict[str, int]:
    """The length of every structure of the scheduler that could grow per job."""
    j = s.journal
    return {
        "live": len(s.jobs.live),
        "ended": len(s.jobs._ended),
        "dispatch_jobs": len(s.state.jobs),
        "dispatch_ready": len(s.state._ready),
        "running": sum(len(n.running) for n in s.state.nodes.values()),
        "templates": len(s.templates),
        "journal": len(j._tx) + len(j._events) + len(j._tiles) + len(j._times) + len(j._late)
        + len(j._held) + len(j._ends),
        "earlier": len(s.results.earlier),
        "plans": len(s.plans._plans),
        "residency": len(s.cluster.residency),
        "live_objects": sum(1 for o in gc.get_objects() if type(o) is LiveJob),
    }


@pytest.mark.slow  # about 40 s: 5,000 jobs through the whole submit path
def test_rss_after_5000_jobs_is_within_10_percent_of_after_500(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Jobs leave memory by count here; the age floor (a job stays RETAIN_MIN_S after it
    # ended) is the next test's: with it the count would depend on the jobs' rate.
    monkeypatch.setattr(jobs, "RETAIN_MIN_S", 0.0)
    limit_malloc_arenas()  # as the scheduler's process does at start (process.prepare_process)

    async def main() -> tuple[dict[str, int], int, dict[str, int], int, int, int]:
        loop = asyncio.get_running_loop()
        transport, fake = await loop.create_datagram_endpoint(FakeExecutor, local_addr=("127.0.0.1", 0))
        port = transport.get_extra_info("sockname")[1]
        reg = MemoryBackend()
        for rec in (NodeInfo("e0", "127.0.0.1", port, port, 1, "0", time.time(), os.getpid(), 1),
                    OpEngineInfo("e0", "numpy", "numpy", "cpu", ("normal", "neg", "exp", "fused"),
                                 ("float32",), 50.0, 10.0),
                    MemoryEngineInfo("e0", "host", "host", 1 << 30, 1 << 30)):
            await reg.put(rec.key(), encode(rec))
        db = await asyncio.to_thread(mdb.open_db, f"sqlite:///{tmp_path / 'meta.sqlite3'}")
        s = Scheduler(registry=reg, db=db, run_dir=tmp_path, secret=SECRET, retain_finished=RETAIN,
                      group_tiny_jobs=False)  # two tasks a job, as counted below
        await s.start()
        try:
            async def one(i: int) -> str:
                body = await s.submit(job_doc(i % 8), ["z"])
                done = await s.wait(body["id"], 10.0)
                assert done["state"] == "done", done
                return str(body["id"])

            async def run(n: int) -> list[str]:
                ids: list[str] = []
                for start in range(0, n, 25):  # 25 in flight at a time
                    ids += await asyncio.gather(*(one(i) for i in range(start, start + 25)))
                return ids

            first = await run(500)
            await asyncio.sleep(0.5)  # the journal's last writes
            gc.collect()
            at_500, rss_500 = per_job_sizes(s), rss_bytes()
            await run(4500)
            await asyncio.sleep(0.5)
            gc.collect()
            at_5000, rss_5000 = per_job_sizes(s), rss_bytes()
            # A job long gone from memory answers from the metadb, as it did when it was live.
            old = s.status(first[0])
            assert old["state"] == "done" and old["progress"] == {"done": 2, "total": 2}, old
            assert first[0] not in s.jobs.live
            return at_500, rss_500, at_5000, rss_5000, fake.ran, len(first)
        finally:
            await s.close()
            transport.close()
            await asyncio.to_thread(db.close)

    at_500, rss_500, at_5000, rss_5000, ran, _ = asyncio.run(main())
    print(f"per-job structures after 500: {at_500}; after 5000: {at_5000}; "
          f"RSS after 500: {rss_500 / 2**20:.1f} MiB, after 5000: {rss_5000 / 2**20:.1f} MiB")
    assert ran >= 2 * 5000
    assert at_5000 == at_500, (at_500, at_5000)
    assert at_5000["live"] <= RETAIN and at_5000["dispatch_jobs"] == 0 and at_5000["templates"] == 0
    assert rss_5000 <= 1.10 * rss_500, (rss_500, rss_5000)


def test_finished_jobs_stay_the_newest_retain_and_a_short_while(tmp_path: Path) -> None:
    """A finished job leaves the dispatcher's state at once; it leaves memory once ``retain``
    newer jobs have finished and it ended over ``RETAIN_MIN_S`` ago (so that the journal
    has written its last task rows when it is read back from the metadb)."""
    from triplane.proto.ir import Graph

    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=SECRET, retain_finished=2)

    def finish_one() -> str:  # a job whose every task is already done: it ends on submit
        plan = compile_job(Graph.from_dict(job_doc(1)), ["z"], cache=s.plans, group=False)
        s.jobs._dispatch(plan, time.time(), tuple((t.id, "e0") for t in plan.specs))
        return plan.job

    async def main() -> tuple[list[str], set[str], set[str]]:
        ids = [finish_one() for _ in range(5)]
        young = set(s.jobs.live)
        for live in s.jobs.live.values():
            live.updated -= 2 * jobs.RETAIN_MIN_S  # as if they ended a while ago
        ids.append(finish_one())
        await asyncio.sleep(0)  # the releases they scheduled
        return ids, young, set(s.jobs.live)

    ids, young, kept = asyncio.run(main())
    assert young == set(ids[:5])  # all ended just now: kept beyond ``retain``
    assert kept == set(ids[-2:])  # the two newest; the others are the metadb's now
    assert not s.state.jobs and not s.templates  # the dispatcher forgot every one at its end
    assert all(s.jobs.live[j].state == "done" and s.jobs.live[j].done == 2 for j in kept)


def test_a_failed_job_out_of_memory_keeps_its_error(tmp_path: Path) -> None:
    """The status of a failed job read back from the metadb names the kind, node and op it
    named while the job was in memory (a ``job.failed`` event), not just the message."""
    from triplane.scheduler.compiler.compile import ClusterSnapshot

    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=SECRET)
    plan = s.jobs.compile(job_doc(1), ["z"], ClusterSnapshot())
    s.jobs.store_job(plan, ["z"], bindings_of(plan), time.time())
    error = {"kind": "user", "message": "exp: overflow", "node": "z", "op": "exp"}
    s.journal.open()
    s.journal.job_ended(plan.job, "failed", 1, error["message"], error)
    s.journal.close()
    body = s.jobs.status(plan.job)
    assert plan.job not in s.jobs.live
    assert body["state"] == "failed" and body["error"] == error, body
    assert s.jobs.list()[0]["state"] == "failed"
