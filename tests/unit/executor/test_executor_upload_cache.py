"""The executor keeps the upload tiles it pulls (pure: a fake puller counts pulls, no sockets)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from triplane.engines import get_op_engine
from triplane.engines.memory.host import HostMemoryEngine
from triplane.executor.tasks import TaskRunner, is_upload_tile
from triplane.proto.packet import Reply, TaskPacket

U = "u-" + "ab" * 16
REGION = f"{U}@0:64,0:64"


class Peers:
    """A fake data-port pull: tiles by id; counts every pull; ``delay`` holds each one."""

    def __init__(self, tiles: dict[str, np.ndarray], delay: float = 0.0) -> None:
        self.tiles = tiles
        self.delay = delay
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, node: str, tile: str) -> np.ndarray:
        self.calls.append((node, tile))
        await asyncio.sleep(self.delay)
        if tile not in self.tiles:
            raise ConnectionError(f"no such tile: {tile}")
        return self.tiles[tile].copy()  # a fresh array, as DataClient.get returns


def make(capacity: int, peers: Peers) -> tuple[TaskRunner, HostMemoryEngine]:
    store = HostMemoryEngine(capacity)
    return TaskRunner(get_op_engine("numpy"), store, peers, node="me", inline_bytes=0), store


def task(tid: str, op: str, ins: tuple[str, ...], out: str, pull: dict[str, str]) -> TaskPacket:
    return TaskPacket(tid, op, ins, (out,), time.time() + 30, pull, {}, "me", time.time())


def run_all(runner: TaskRunner, *tasks: TaskPacket) -> list[Reply]:
    async def go() -> list[Reply]:
        return list(await asyncio.gather(*(runner.run(t, time.time()) for t in tasks)))

    try:
        return asyncio.run(asyncio.wait_for(go(), 10))
    finally:
        runner.close()


def test_upload_tiles_are_recognised_by_id() -> None:
    assert is_upload_tile(U) and is_upload_tile(REGION)
    assert not is_upload_tile("j0123456789abcdef.t3") and not is_upload_tile("u-short")


def test_a_second_task_reads_a_kept_upload_tile_without_pulling_it() -> None:
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
    peers = Peers({REGION: x})
    runner, store = make(1 << 20, peers)

    async def two_jobs() -> tuple[Reply, Reply]:
        pull = {REGION: "scheduler"}
        first = await runner.run(task("j1.t1.a0", "neg", (REGION,), "j1.t1", pull), time.time())
        second = await runner.run(task("j2.t1.a0", "exp", (REGION,), "j2.t1", pull), time.time())
        return first, second

    try:
        first, second = asyncio.run(asyncio.wait_for(two_jobs(), 10))
    finally:
        runner.close()
    assert first.ok and second.ok, (first.error, second.error)
    assert peers.calls == [("scheduler", REGION)]  # one pull for both jobs
    assert runner.stats["upload_pulls"] == 1 and runner.stats["upload_hits"] == 1
    assert store.cache_keys() == [REGION] and store.cached() == x.nbytes
    np.testing.assert_array_equal(store.get("j2.t1"), np.exp(x))
    assert store.free() == store.capacity() - store.used()  # nothing left in use


def test_concurrent_tasks_share_one_pull_of_an_upload_tile() -> None:
    x = np.ones((64, 64), np.float32)
    peers = Peers({U: x}, delay=0.05)
    runner, _ = make(1 << 20, peers)
    replies = run_all(runner, *(task(f"j.t{i}.a0", "neg", (U,), f"j.t{i}", {U: "scheduler"})
                                for i in range(3)))
    assert all(r.ok for r in replies), [r.error for r in replies]
    assert peers.calls == [("scheduler", U)]
    assert runner.stats["pulled_bytes"] == x.nbytes


def test_a_task_that_needs_room_evicts_cache_and_succeeds() -> None:
    a = np.ones((64, 64), np.float32)  # 16 KiB each
    b = np.full((64, 64), 2.0, np.float32)
    ua, ub = U, "u-" + "cd" * 16
    peers = Peers({ua: a, ub: b})
    runner, store = make(3 * a.nbytes, peers)  # room for an input, an output and one more

    async def go() -> list[Reply]:
        out = [await runner.run(task("j.t1.a0", "neg", (ua,), "j.t1", {ua: "scheduler"}), time.time())]
        store.delete("j.t1")
        out.append(await runner.run(task("j.t2.a0", "neg", (ub,), "j.t2", {ub: "scheduler"}), time.time()))
        # Cache now holds both uploads (2 x 16 KiB) beside the 16 KiB output: the memory is
        # full, yet a task needing a new output tile succeeds by evicting the older entry.
        out.append(await runner.run(task("j.t3.a0", "neg", (ub,), "j.t3", {ub: "scheduler"}), time.time()))
        return out

    try:
        replies = asyncio.run(asyncio.wait_for(go(), 10))
    finally:
        runner.close()
    assert all(r.ok for r in replies), [r.error for r in replies]
    assert store.cache_keys() == [ub]  # ua (least recently used) went, ub is read again
    assert store.cache_stats["evictions"] == 1
    assert peers.calls == [("scheduler", ua), ("scheduler", ub)]
    assert store.used() == 2 * a.nbytes and store.free() == a.nbytes  # ub is evictable: free


def test_a_task_whose_own_cached_input_leaves_no_room_for_its_output_still_runs() -> None:
    x = np.ones((64, 64), np.float32)
    peers = Peers({U: x})
    runner, store = make(x.nbytes + 1024, peers)
    store.put("pinned", np.zeros(256, np.float32))  # 1 KiB of tiles: exactly 16 KiB left
    # The pulled input fills what is left as a cache entry in use; its output (4 bytes)
    # would not fit beside it. Without the cache it would: the task gives the entry up.
    replies = run_all(runner, task("j.t1.a0", "sum", (U,), "j.t1", {U: "scheduler"}))
    assert replies[0].ok, replies[0].error
    assert store.get("j.t1") == x.sum() and store.cache_keys() == []
    assert store.free() == store.capacity() - store.used()


def test_a_failed_pull_leaves_no_cache_entry_in_use() -> None:
    x = np.ones((8, 8), np.float32)
    peers = Peers({U: x})
    runner, store = make(1 << 20, peers)
    other = "u-" + "ef" * 16  # not at the peer: its pull fails
    replies = run_all(runner,
                      task("j.t1.a0", "neg", (U,), "j.t1", {U: "scheduler"}),
                      task("j.t2.a0", "add", (U, other), "j.t2", {U: "scheduler", other: "scheduler"}))
    assert replies[0].ok and not replies[1].ok and replies[1].error.kind == "infra"
    assert other in replies[1].error.message
    assert store.free() == store.capacity() - store.used()  # U is kept but not in use


def test_pulled_job_tiles_are_still_not_kept() -> None:
    x = np.ones((8, 8), np.float32)
    peers = Peers({"j.t0": x})
    runner, store = make(1 << 20, peers)
    replies = run_all(runner, task("j.t1.a0", "neg", ("j.t0",), "j.t1", {"j.t0": "n2"}))
    assert replies[0].ok and "j.t0" not in store and store.cache_keys() == []
