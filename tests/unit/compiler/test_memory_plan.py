"""Memory planning: buffers are freed after their last reader, never when they are
outputs, and the runtime holds exactly what the plan says."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.engines.registry import get_op_engine
from triplane.executor.local import run_plan
from triplane.proto.builder import Builder
from triplane.scheduler.compiler.memory import plan_memory
from triplane.scheduler.compiler.pipeline import CompileOptions, compile_graph
from triplane.testing import assert_close

PLAIN = CompileOptions(cse=False, fold=False, fuse=False)


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def test_deep_chain_reuses_memory(seed: int) -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(64, 64), dtype="float64")
    y = x
    for _ in range(30):
        y = b.op("neg", b.op("exp", y))
    plan = compile_graph(b.graph([y]), PLAIN)
    nbytes = 64 * 64 * 8
    assert plan.memory.no_reuse_bytes == 61 * nbytes
    assert plan.memory.peak_bytes == 2 * nbytes  # the value being read and the one made
    assert plan.memory.peak_bytes < plan.memory.no_reuse_bytes / 10
    stats: dict[str, int] = {}
    xv = np.random.default_rng(seed).uniform(-1, 1, (64, 64))
    out = run_plan(plan, {"x": xv}, get_op_engine("numpy"), stats)
    assert stats["peak_bytes"] == plan.memory.peak_bytes
    want = xv
    for _ in range(30):
        want = -np.exp(want)
    assert_close(out[y.id], want, "float64", what=f"seed={seed}")


def test_outputs_are_never_freed_and_shared_values_live_to_their_last_reader() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(8,), dtype="float32")
    shared = b.op("exp", x)
    mid = b.op("neg", b.op("neg", x))            # runs between the two readers of `shared`
    first = b.op("add", shared, mid)
    tail = b.op("log", first)
    second = b.op("mul", tail, shared)           # the last reader of `shared`
    g = b.graph([first, second])
    plan = plan_memory(g)
    order = [s.node for s in plan.steps]
    freed_at = {v: s.node for s in plan.steps for v in s.free}
    assert first.id not in freed_at and second.id not in freed_at  # outputs stay
    assert freed_at[shared.id] == second.id
    assert order.index(first.id) < order.index(second.id)
    for v, at in freed_at.items():  # every value dies at its last reader
        readers = [order.index(n) for n in g.nodes if v in g.nodes[n].inputs]
        assert order.index(at) == max(readers, default=order.index(v))
    assert set(freed_at) == set(g.nodes) - {first.id, second.id}


def test_runtime_keeps_outputs_and_matches_the_planned_peak(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.op("input", tensor="x", shape=(16, 8), dtype="float32")
    w = b.op("input", tensor="w", shape=(8, 4), dtype="float32")
    h = b.op("matmul", x, w)
    a = b.op("exp", h)
    s = b.op("sum", a, axes=[1])
    plan = compile_graph(b.graph([h, s]), PLAIN)
    data = {"x": rng.standard_normal((16, 8)).astype(np.float32),
            "w": rng.standard_normal((8, 4)).astype(np.float32)}
    stats: dict[str, int] = {}
    out = run_plan(plan, data, get_op_engine("numpy"), stats)
    assert set(out) == {h.id, s.id}
    assert stats["peak_bytes"] == plan.memory.peak_bytes
    ref = data["x"].astype(np.float64) @ data["w"].astype(np.float64)
    assert_close(out[h.id], ref, "float32", rtol=1e-5, atol=1e-5, what=f"seed={seed}")
    assert_close(out[s.id], np.exp(ref).sum(axis=1), "float32", rtol=1e-5, atol=1e-5, what=f"seed={seed}")
