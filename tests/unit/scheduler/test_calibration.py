"""Learning how fast executors run now from their tasks' kernel times (pure)."""

from __future__ import annotations

import math
import random

import pytest

from triplane.scheduler.calibration import Calibration, bound_of
from triplane.scheduler.compiler.costmodel import NodeFigures, TaskCost


def fig(name: str = "n1", gflops: float = 100.0, gbps: float = 10.0) -> NodeFigures:
    return NodeFigures(name, gflops, gbps, 1 << 30)


def test_a_node_running_slower_than_registered_is_predicted_slower() -> None:
    rng = random.Random()
    slowdown = rng.uniform(1.3, 1.8)
    c = Calibration()
    for _ in range(20):  # 20 kernels of about 0.5 s, each ~slowdown x the prediction
        predicted = rng.uniform(0.4, 0.6)
        c.observe("n1", "flops", predicted, predicted * slowdown * rng.uniform(0.97, 1.03))
    assert c.factor("n1", "flops") == pytest.approx(slowdown, rel=0.06)  # steps of 5%
    assert c.factor("n1", "bytes") == 1.0 and c.factor("n2", "flops") == 1.0  # learned apart
    (f1, f2) = c.apply([fig("n1"), fig("n2")])
    assert f1.gflops == pytest.approx(100.0 / c.factor("n1", "flops")) and f1.gbps == 10.0
    assert f2 == fig("n2")  # nothing learned: the very same figures


def test_what_a_job_teaches_is_measured_against_the_registered_rates() -> None:
    # A job planned with factor 1.5 already applied: tasks that take what it predicted
    # confirm 1.5, they do not pull the factor back to 1.
    c = Calibration()
    for _ in range(30):
        c.observe("n1", "flops", 0.5, 0.75)
    assert c.factor("n1", "flops") == pytest.approx(1.5, rel=0.03)
    snap = c.snapshot(["n1"])
    for _ in range(30):
        c.observe("n1", "flops", 0.75, 0.75, planned_factor=snap["n1"][0])
    assert c.factor("n1", "flops") == pytest.approx(1.5, rel=0.03)


def test_small_tasks_and_freaks_move_little() -> None:
    c = Calibration()
    for _ in range(1000):  # tiny kernels: their time is overhead
        c.observe("n1", "bytes", 0.001, 0.05)
    assert c.factor("n1", "bytes") == 1.0
    c.observe("n1", "bytes", 1.0, 1000.0)  # one stalled kernel: clamped to 4x, weight 0.39
    assert 1.0 < c.factor("n1", "bytes") <= math.exp(0.4 * math.log(4.0)) * 1.05
    for _ in range(40):  # back on time: forgotten
        c.observe("n1", "bytes", 0.5, 0.5)
    assert c.factor("n1", "bytes") == 1.0
    c.observe("n1", "bytes", 0.5, 0.0)  # nonsense timings are ignored
    c.observe("n1", "bytes", float("nan"), 1.0)
    assert c.factor("n1", "bytes") == 1.0


def test_a_steady_machine_gives_the_same_figures_job_after_job() -> None:
    c = Calibration()
    rng = random.Random()
    seen = set()
    for i in range(200):
        c.observe("n1", "flops", 0.5, 0.5 * 1.3 * rng.uniform(0.99, 1.01))
        if i >= 100:
            seen.add(c.apply([fig()])[0].gflops)
    assert len(seen) <= 2  # rounded to steps: jitter does not change the plan's figures


def test_forget_and_bound() -> None:
    c = Calibration()
    c.observe("n1", "flops", 1.0, 3.0)
    c.forget("n1")
    assert c.factor("n1", "flops") == 1.0
    assert bound_of(TaskCost(2e9, 1e6, 0), fig()) == "flops"  # 20 ms of flops, 0.1 ms of bytes
    assert bound_of(TaskCost(1e6, 1e9, 0), fig()) == "bytes"
    with pytest.raises(ValueError):
        Calibration(lo=2.0)


def test_a_job_after_slow_kernels_is_planned_with_the_learned_speed(tmp_path) -> None:
    # A Scheduler that is not started (its "executors" are registry records): the first
    # job's matmul tasks "finish" at twice their predicted kernel time; the next submit of
    # the same graph predicts each task about twice as long, and where it ran nothing else.
    import asyncio

    from fastapi.testclient import TestClient

    from triplane import metadb as mdb
    from triplane.proto.packet.schema import Reply, Timings
    from triplane.registry import MemoryBackend, MemoryEngineInfo, NodeInfo, OpEngineInfo
    from triplane.registry.records import encode
    from triplane.scheduler.api.app import create_app
    from triplane.scheduler.service import Scheduler

    reg = MemoryBackend()

    async def register() -> None:
        for i in range(2):
            for rec in (NodeInfo(f"e{i}", "127.0.0.1", 1, 1, 1, "0", 0.0, 1),
                        OpEngineInfo(f"e{i}", "numpy", "numpy", "cpu", ("normal", "matmul"), ("float32",),
                                     50.0, 10.0),
                        MemoryEngineInfo(f"e{i}", "host", "host", 1 << 30, 1 << 30)):
                await reg.put(rec.key(), encode(rec))

    asyncio.run(register())
    s = Scheduler(registry=reg, db=mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}"), run_dir=tmp_path,
                  secret=b"s" * 32)
    auth = {"Authorization": "Bearer test-token-0123456789"}
    c = TestClient(create_app(s, "test-token-0123456789"))
    attrs = {"mean": 0, "std": 1, "offset": 0, "dtype": "float32", "full_shape": None, "start": None}
    doc = {"version": 1, "outputs": ["y"], "nodes": {
        "a": {"op": "normal", "shape": [2048, 2048], "dtype": "float32",
              "attrs": {**attrs, "seed": 1, "shape": [2048, 2048]}},
        "w": {"op": "normal", "shape": [2048, 2048], "dtype": "float32",
              "attrs": {**attrs, "seed": 2, "shape": [2048, 2048]}},
        "y": {"op": "matmul", "inputs": ["a", "w"], "shape": [2048, 2048], "dtype": "float32"}}}

    def plan_of(job: str) -> dict:
        r = c.get(f"/v1/jobs/{job}/plan", headers=auth)
        assert r.status_code == 200, r.text
        return {t["task"]: t for t in r.json()["tasks"]}

    first = c.post("/v1/jobs", json={"graph": doc, "fetch": ["y"]}, headers=auth).json()["id"]
    before = plan_of(first)
    matmuls = {t: p for t, p in before.items() if p["op"] == "matmul"}
    assert matmuls and {p["node"] for p in matmuls.values()} == {"e0", "e1"}
    for _ in range(40):  # forty runs' worth of kernels, each twice the predicted time
        for t, p in matmuls.items():
            kernel = 2.0 * (p["predicted"]["compute_s"] - 200e-6)
            reply = Reply(f"{first}.{t}", True, Timings(0.0, 1.0, 1.0 + kernel), (), None)
            s.jobs.output(first, t, p["node"], reply)
    assert s.cluster.calibration.factor("e0", "flops") == pytest.approx(2.0, rel=0.06)
    nodes = {n["node"]: n for n in c.get("/v1/nodes", headers=auth).json()["items"]}
    assert nodes["e0"]["calibration"]["flops"] == pytest.approx(2.0, rel=0.06)
    assert nodes["e0"]["calibration"]["bytes"] == 1.0
    again = plan_of(c.post("/v1/jobs", json={"graph": doc, "fetch": ["y"]}, headers=auth).json()["id"])
    for t, p in matmuls.items():
        want = 2.0 * p["predicted"]["compute_s"]
        assert again[t]["predicted"]["compute_s"] == pytest.approx(want, rel=0.08)
