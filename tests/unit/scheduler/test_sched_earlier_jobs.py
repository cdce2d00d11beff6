"""A restarted scheduler answers for the done jobs an earlier process ran (docs/scheduler.md,
"Restart and failover"): it streams their fetched tensors from the executors its task rows
name, serves the plan recorded at submit, and keeps released tensors released.

Two Scheduler objects share one SQLite metadb; neither is started: "executors" are entries
of the shell's node table and a fake data-port client that serves tiles of one array."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triplane import metadb as mdb
from triplane.metadb.jobs import job_plan
from triplane.proto.packet import Reply, TileInfo, Timings
from triplane.registry import MemoryBackend, NodeInfo
from triplane.scheduler.api.errors import status_of
from triplane.scheduler.compiler.compile import ClusterSnapshot
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.jobplan import JobPlan
from triplane.scheduler.compiler.layout import figures_to_json
from triplane.scheduler.dispatch.state import Transitioned
from triplane.scheduler.errors import SchedulerError
from triplane.scheduler.livejob import LiveJob
from triplane.scheduler.service import Scheduler

MiB = 1 << 20
NODES = ("e0", "e1", "e2")


def figs() -> list[NodeFigures]:
    return [NodeFigures(n, 50.0, 10.0, 8 * MiB) for n in NODES]  # an 8 MiB output: 4 tiles


def big(rows: int = 2048, cols: int = 1024) -> dict[str, Any]:
    """normal -> neg: an 8 MiB output, cut into several tiles for ``figs()``."""
    nodes = {"x": {"op": "normal", "shape": [rows, cols], "dtype": "float32",
                   "attrs": {"seed": 3, "shape": [rows, cols], "dtype": "float32"}},
             "y": {"op": "neg", "inputs": ["x"], "shape": [rows, cols], "dtype": "float32"}}
    return {"version": 1, "nodes": nodes, "outputs": ["y"]}


def tiny() -> dict[str, Any]:
    nodes = {"x": {"op": "normal", "shape": [4], "dtype": "float32",
                   "attrs": {"seed": 3, "shape": [4], "dtype": "float32"}},
             "y": {"op": "neg", "inputs": ["x"], "shape": [4], "dtype": "float32"}}
    return {"version": 1, "nodes": nodes, "outputs": ["y"]}


class FakeDataPort:
    """Serves tile ``<job>.<task>`` as ``regions[task]`` of ``array``, from the node the test
    says holds it (by data port); records reads and deletes."""

    def __init__(self, array: np.ndarray, regions: dict[str, tuple[tuple[int, int], ...]],
                 held: dict[str, str]) -> None:
        self.array, self.regions, self.held = array, regions, held
        self.reads: list[tuple[str, str]] = []  # (node, tile)
        self.deleted: list[tuple[str, str]] = []

    async def open_tile(self, address: str, port: int,
                        tile: str) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
        from triplane.proto.dataport import DataPortError

        node = NODES[port - 9000]
        task = tile.split(".", 1)[1]
        if self.held.get(task) != node:
            raise DataPortError(f"no such tile: {tile}", kind="missing")
        self.reads.append((node, tile))
        part = np.ascontiguousarray(self.array[tuple(slice(a, b) for a, b in self.regions[task])])

        async def chunks() -> AsyncIterator[bytes]:
            yield part.tobytes()

        return part.shape, "float32", part.nbytes, chunks()

    async def delete(self, address: str, port: int, tiles: list[str]) -> None:
        node = NODES[port - 9000]
        for tile in tiles:
            self.deleted.append((node, tile))
            self.held.pop(tile.split(".", 1)[1], None)


def scheduler(db: mdb.MetaDB, tmp_path: Path, live: tuple[str, ...] = NODES) -> Scheduler:
    s = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)
    for n in live:
        s.shell.nodes[n] = NodeInfo(n, "127.0.0.1", 1, 1, 9000 + NODES.index(n), "0", 0.0, 1)
    return s


def run_done(first: Scheduler, db: mdb.MetaDB, graph: dict[str, Any], *, tiled: bool = True,
             state: str = "done") -> JobPlan:
    """What the first process records for a job it ran to ``state``: the job as a submit
    stores it, each task done on the node placement chose (e0 for an unplaced one)."""
    plan = first.jobs.compile(graph, ["y"], ClusterSnapshot(tuple(figs())))
    args = plan.args
    bindings: dict[str, Any] = {"args": list(args), "fetch": dict(plan.fetch)}
    if tiled:
        assert plan.layout is not None and plan.layout.tiled
        bindings["figures"] = figures_to_json(plan.layout.figures)
    first.jobs.store_job(plan, ["y"], bindings, time.time())
    with db.transaction() as s:
        for t in plan.specs:
            mdb.transition_task(s, plan.job, t.id, "done", node=t.node or "e0", attempt=0)
        mdb.set_job_state(s, plan.job, state)
    return plan


def run_replied(first: Scheduler, db: mdb.MetaDB, graph: dict[str, Any], ran: int | None = None,
                state: str = "done") -> tuple[JobPlan, dict[str, tuple[float, float]]]:
    """A tiled job run by ``first`` through its journal as the dispatch shell feeds it: per
    task dispatched, the executor's reply (``_output``, known kernel times), done. Only
    the first ``ran`` tasks run (all by default). Returns the plan and task -> (start, end)."""
    plan = first.jobs.compile(graph, ["y"], ClusterSnapshot(tuple(figs())))
    args = plan.args
    assert plan.layout is not None and plan.layout.tiled
    figures = figures_to_json(plan.layout.figures)
    bindings = {"args": list(args), "fetch": dict(plan.fetch), "figures": figures}
    now = time.time()
    first.jobs.store_job(plan, ["y"], bindings, now)
    first.jobs.live[plan.job] = LiveJob(plan, dict(plan.back), now, now)
    first.journal.open()
    times: dict[str, tuple[float, float]] = {}
    for i, t in enumerate(plan.specs[:ran]):
        job, node, start = plan.job, t.node or "e0", 1_700_000_000.0 + 0.5 * i
        times[t.id] = (start, start + 0.125 * (i + 1))
        first.journal.transitions([Transitioned(job, t.id, "ready", "dispatched", 0, node, "s", start - 0.1)])
        r = Reply(f"{job}.{t.id}.a0", True, Timings(start - 0.05, *times[t.id]),
                  (TileInfo(f"{job}.{t.id}", (1,), "float32", 4),))
        first.jobs.output(job, t.id, node, r)
        first.journal.transitions([Transitioned(job, t.id, "dispatched", "done", 0, node, "s", start + 9.0)])
    first.jobs.live[plan.job].state = state
    first.journal.job_ended(plan.job, state, len(times), None)
    first.journal.close()
    return plan, times


def test_a_restarted_scheduler_shows_the_kernel_times_the_first_one_saw(
        db: mdb.MetaDB, tmp_path: Path) -> None:
    first = scheduler(db, tmp_path)
    plan, times = run_replied(first, db, big())
    assert len(times) > 2
    live = asyncio.run(first.plan(plan.job))
    doc = asyncio.run(scheduler(db, tmp_path).plan(plan.job))
    assert doc["recorded"] is True and "recorded" not in live
    # Exactly the actual times of the live job's plan, task by task and for the makespan.
    by_task = {t["task"]: t for t in doc["tasks"]}
    assert set(by_task) == set(times) == {t["task"] for t in live["tasks"]}
    for t in live["tasks"]:
        assert (by_task[t["task"]]["actual"], by_task[t["task"]]["ratio"]) == (t["actual"], t["ratio"])
    assert doc["makespan"] == live["makespan"] and doc["tasks_run"] == live["tasks_run"] == len(times)
    # ... which are the kernels' times, shifted so that the first start is 0.
    t0 = min(s for s, _ in times.values())
    for task, (s, e) in times.items():
        got = by_task[task]["actual"]
        assert got == pytest.approx({"start_s": s - t0, "finish_s": e - t0, "duration_s": e - s})
        p = by_task[task]["predicted"]
        assert by_task[task]["ratio"] == pytest.approx((e - s) / (p["compute_s"] + p["comm_s"]))
    assert doc["makespan"]["actual_s"] == pytest.approx(max(e for _, e in times.values()) - t0)
    ms = doc["makespan"]
    assert ms["ratio"] == pytest.approx(ms["actual_s"] / ms["predicted_s"])
    with db.read() as s:
        rows = {r.task_id: r for r in mdb.list_tasks(s, plan.job)}
    assert {t: (r.started_at, r.finished_at) for t, r in rows.items()} == times
    assert all(r.actual_s == pytest.approx(r.finished_at - r.started_at) for r in rows.values())
    assert all(r.predicted_s is not None and r.predicted_s > 0 for r in rows.values())


def test_a_partly_run_earlier_job_shows_the_times_of_the_tasks_that_ran_and_no_makespan(
        db: mdb.MetaDB, tmp_path: Path) -> None:
    plan, times = run_replied(scheduler(db, tmp_path), db, big(), ran=2, state="failed")
    doc = asyncio.run(scheduler(db, tmp_path).plan(plan.job))
    ran = {t["task"] for t in doc["tasks"] if t["actual"] is not None}
    assert ran == set(times) and len(doc["tasks"]) > len(ran) and doc["tasks_run"] == 2
    first = min(times, key=lambda t: times[t][0])
    assert next(t for t in doc["tasks"] if t["task"] == first)["actual"]["start_s"] == 0.0
    assert doc["makespan"]["actual_s"] is None and doc["makespan"]["ratio"] is None


def regions_of(plan: JobPlan) -> dict[str, tuple[tuple[int, int], ...]]:
    grid = plan.fetch_grid("y")
    assert grid is not None and len(grid) > 1
    return {grid.tiles[c]: tuple(grid.region(c)) for c in grid.cells()}


async def read(s: Scheduler, job: str, name: str = "y") -> tuple[tuple[int, ...], bytes]:
    shape, _, nbytes, chunks = await s.open_tensor(job, name)
    buf = b"".join([c async for c in chunks])
    assert len(buf) == nbytes
    return tuple(shape), buf


@pytest.fixture
def db(tmp_path: Path) -> mdb.MetaDB:
    return mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")


def test_a_restarted_scheduler_streams_a_done_tiled_tensor_from_the_nodes_its_rows_name(
        db: mdb.MetaDB, tmp_path: Path) -> None:
    plan = run_done(scheduler(db, tmp_path), db, big())
    regions = regions_of(plan)
    held = {t.id: t.node or "e0" for t in plan.specs}
    assert len({held[t] for t in regions}) > 1  # the tiles are spread over several nodes
    want = np.arange(2048 * 1024, dtype=np.float32).reshape(2048, 1024)
    second = scheduler(db, tmp_path)
    port = second.results.data_client = FakeDataPort(want, regions, dict(held))  # type: ignore[assignment]

    async def go() -> list[tuple[tuple[int, ...], bytes]]:
        return [await read(second, plan.job), await read(second, plan.job)]

    (shape, got), again = asyncio.run(go())
    assert shape == (2048, 1024) and got == want.tobytes() and again == (shape, got)
    # Each tile was read from the node its task row names (the fake refuses any other).
    assert sorted(set(port.reads)) == sorted((held[t], f"{plan.job}.{t}") for t in regions)
    earlier = second.results.earlier
    assert earlier.loads == 1 and len(earlier) == 1  # compiled once, then cached
    assert plan.job not in second.jobs.live  # not dispatched: a view only


def test_a_tile_whose_holder_is_gone_is_404_naming_the_tensor_tile_and_node(
        db: mdb.MetaDB, tmp_path: Path) -> None:
    plan = run_done(scheduler(db, tmp_path), db, big())
    regions = regions_of(plan)
    held = {t.id: t.node or "e0" for t in plan.specs}
    gone = held[next(iter(regions))]
    second = scheduler(db, tmp_path, live=tuple(n for n in NODES if n != gone))
    second.results.data_client = FakeDataPort(np.zeros((2048, 1024), np.float32), regions, held)  # type: ignore[assignment]
    # No dispatcher runs here to compute the tile again (lineage.py: test_cluster_lineage.py
    # does, on a real cluster): without it, the fetch says where the tile was.
    second.results.lineage = None
    with pytest.raises(SchedulerError) as e:
        asyncio.run(read(second, plan.job))
    assert status_of(e.value.kind) == 404
    msg = e.value.message
    assert "'y'" in msg and plan.job in msg and f"node {gone}" in msg and f"tile {plan.job}.t" in msg


def test_the_plan_of_an_earlier_job_is_the_prediction_recorded_at_submit(
        db: mdb.MetaDB, tmp_path: Path) -> None:
    plan = run_done(scheduler(db, tmp_path), db, big())
    with db.read() as s:
        stored = job_plan(s, plan.job)
    assert stored is not None
    doc = asyncio.run(scheduler(db, tmp_path).plan(plan.job))
    assert doc["recorded"] is True and doc["job"] == plan.job and doc["followed"] is True
    assert doc["makespan"]["predicted_s"] == pytest.approx(stored.predicted_makespan)
    assert doc["makespan"]["actual_s"] is None and all(t["actual"] is None for t in doc["tasks"])
    # The explain schema, with additive fields only.
    assert set(stored.plan) <= set(doc) and set(doc) - set(stored.plan) == {"recorded"}
    assert {t["task"] for t in doc["tasks"]} == {t.id for t in plan.specs}


def test_a_tiny_earlier_job_is_placed_on_demand_and_says_it_is_not_recorded(
        db: mdb.MetaDB, tmp_path: Path) -> None:
    first = scheduler(db, tmp_path)
    first.jobs.group = False  # its plan is shown node by node, as each node was a task
    plan = run_done(first, db, tiny(), tiled=False)
    second = scheduler(db, tmp_path)
    with pytest.raises(SchedulerError) as e:  # no executor figures: nothing to place it for
        asyncio.run(second.plan(plan.job))
    assert status_of(e.value.kind) == 404 and "no prediction was recorded" in e.value.message
    second.cluster._figs = (time.monotonic() + 60, figs(), [])  # the registry's figures, as if just read
    doc = asyncio.run(second.plan(plan.job))
    assert doc["recorded"] is False and doc["followed"] is False and doc["job"] == plan.job
    assert {t["task"] for t in doc["tasks"]} == {t.id for t in plan.specs}
    assert doc["makespan"]["actual_s"] is None  # its rows hold no kernel times
    # Rows that hold the kernel's times (as the journal writes them): shown beside the
    # predictions, shifted to start at 0, the makespan too once every task has one.
    kernels = {t.id: (1000.0 + i, 1000.5 + i) for i, t in enumerate(plan.specs)}
    with db.transaction() as s:
        for task, (start, end) in kernels.items():
            mdb.transition_task(s, plan.job, task, "done", started_at=start, finished_at=end,
                                actual_s=end - start)
    doc = asyncio.run(second.plan(plan.job))
    got = {t["task"]: t["actual"] for t in doc["tasks"]}
    assert got == {task: {"start_s": start - 1000.0, "finish_s": end - 1000.0, "duration_s": 0.5}
                   for task, (start, end) in kernels.items()}
    assert doc["makespan"]["actual_s"] == pytest.approx(len(kernels) - 0.5)


def test_released_tensors_stay_404_whichever_process_released_them(db: mdb.MetaDB, tmp_path: Path) -> None:
    first = scheduler(db, tmp_path, live=())
    by_first = run_done(first, db, big())
    by_second = run_done(first, db, big())
    now = time.time()
    first.jobs.live[by_first.job] = LiveJob(by_first, {}, now, now, state="done")
    asyncio.run(first.cancel(by_first.job))  # DELETE answered by the first process

    second = scheduler(db, tmp_path)
    regions = regions_of(by_second)
    held = {t.id: t.node or "e0" for t in by_second.specs}
    port = second.results.data_client = FakeDataPort(np.zeros((2048, 1024), np.float32), regions,  # type: ignore[assignment]
                                             dict(held))
    second.results.releaser.client = port  # type: ignore[assignment]

    async def go() -> None:
        with pytest.raises(SchedulerError) as e:
            await second.open_tensor(by_first.job, "y")
        assert status_of(e.value.kind) == 404 and "released" in e.value.message
        await read(second, by_second.job)  # still held
        body = await second.cancel(by_second.job)  # DELETE of a job the first process ran
        assert body["state"] == "done"
        with pytest.raises(SchedulerError) as e:
            await second.open_tensor(by_second.job, "y")
        assert status_of(e.value.kind) == 404 and "released" in e.value.message
        await second.results.releaser.flush()  # (sent within RELEASE_BATCH_S otherwise)

    asyncio.run(go())
    # The second process deleted the fetched tiles where they were held.
    assert sorted(port.deleted) == sorted((held[t], f"{by_second.job}.{t}") for t in regions)
    third = scheduler(db, tmp_path)
    for job in (by_first.job, by_second.job):
        with pytest.raises(SchedulerError) as e:
            asyncio.run(third.open_tensor(job, "y"))
        assert status_of(e.value.kind) == 404 and "released" in e.value.message


def test_failed_unknown_and_unfetched_keep_their_answers(db: mdb.MetaDB, tmp_path: Path) -> None:
    failed = run_done(scheduler(db, tmp_path), db, big(), state="failed")
    done = run_done(scheduler(db, tmp_path), db, big())
    second = scheduler(db, tmp_path)
    cases = [(failed.job, "y", 409, "is failed"), ("j0123456789abcdef", "y", 404, "unknown job"),
             (done.job, "x", 404, "did not fetch 'x'")]
    for job, name, status, words in cases:
        with pytest.raises(SchedulerError) as e:
            asyncio.run(second.open_tensor(job, name))
        assert status_of(e.value.kind) == status and words in e.value.message, e.value
    assert second.results.earlier.loads == 3 and len(second.results.earlier) == 1  # only the done job is kept
