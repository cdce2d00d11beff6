"""The transposes pass: transposed matmul results become matmuls of transposed operands,
transposes of transposes compose, and the values stay those of the graph as written."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.engines.registry import get_op_engine
from triplane.executor.local import run_plan
from triplane.proto.builder import Builder
from triplane.proto.validate import validate
from triplane.scheduler.compiler.dce import dce
from triplane.scheduler.compiler.pipeline import CompileOptions, compile_graph
from triplane.scheduler.compiler.transposes import fold_transposes
from triplane.testing import assert_close


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def _t(b: Builder, x, perm=(1, 0)):
    return b.op("transpose", x, perm=list(perm))


def test_a_weight_gradient_is_a_matmul_of_the_transposed_gradient() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(8, 4), dtype="float32")
    g = b.op("input", tensor="g", shape=(8, 3), dtype="float32")
    gw = _t(b, b.op("matmul", _t(b, x), g))  # autograd's d(x @ w.T)/dw, (3, 4)
    out = dce(fold_transposes(validate(b.graph([gw]))))
    node = out[gw.id]
    assert node.op == "matmul" and node.shape == (3, 4)
    first = out[node.inputs[0]]
    assert first.op == "transpose" and first.inputs == (g.id,) and node.inputs[1] == x.id
    assert sorted(n.op for n in out.nodes.values()) == ["input", "input", "matmul", "transpose"]


def test_transposes_of_transposes_compose_and_identities_vanish() -> None:
    b = Builder()
    w = b.op("input", tensor="w", shape=(2, 3, 4), dtype="float32")
    back = _t(b, _t(b, w, (2, 0, 1)), (1, 2, 0))  # the identity
    mixed = _t(b, _t(b, w, (1, 0, 2)), (0, 2, 1))
    y = b.op("add", back, w)
    out = dce(fold_transposes(validate(b.graph([y, mixed]))))
    assert out[y.id].inputs == (w.id, w.id)
    assert out[mixed.id].inputs == (w.id,) and tuple(out[mixed.id].attrs["perm"]) == (1, 2, 0)
    assert out[mixed.id].shape == (3, 4, 2)


def test_left_alone_when_the_matmul_is_read_twice_or_is_an_output() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(5, 4), dtype="float32")
    y = b.op("input", tensor="y", shape=(4, 6), dtype="float32")
    m = b.op("matmul", _t(b, y), _t(b, x))
    twice = validate(b.graph([_t(b, m), b.op("exp", m)]))
    assert fold_transposes(twice)[twice.outputs[0]].op == "transpose"
    b = Builder()
    x = b.op("input", tensor="x", shape=(5, 4), dtype="float32")
    m = b.op("matmul", x, b.op("input", tensor="y", shape=(4, 6), dtype="float32"))
    assert fold_transposes(validate(b.graph([m, _t(b, m)])))[m.id].op == "matmul"
    # neither operand a transpose: two new transposes would be needed, so it stays
    assert fold_transposes(validate(b.graph([_t(b, m)])))[m.id].op == "matmul"


def test_values_match_the_graph_as_written(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.op("input", tensor="x", shape=(16, 8), dtype="float64")
    w = b.op("input", tensor="w", shape=(5, 8), dtype="float64")
    g = b.op("input", tensor="g", shape=(16, 5), dtype="float64")
    h = b.op("matmul", x, _t(b, w))
    gw = _t(b, b.op("matmul", _t(b, x), g))
    gx = b.op("matmul", g, _t(b, _t(b, w)))
    both = _t(b, b.op("matmul", _t(b, g), _t(b, _t(b, x, (1, 0)))))  # both operands transposed
    graph = b.graph([h, gw, gx, both])
    xs = {"x": rng.standard_normal((16, 8)), "w": rng.standard_normal((5, 8)),
          "g": rng.standard_normal((16, 5))}
    eng = get_op_engine("numpy")
    plain = run_plan(compile_graph(graph, CompileOptions(cse=False, fold=False, fuse=False)), xs, eng)
    plan = compile_graph(graph)
    assert "transposes" in plan.passes
    assert sum(n.op == "transpose" for n in plan.graph.nodes.values()) < 7
    opt = run_plan(plan, xs, eng)
    for out in graph.outputs:
        assert_close(opt[out], plain[out], "float64", what=f"seed={seed}")
    assert_close(opt[both.id], xs["x"].T @ xs["g"], "float64", what=f"seed={seed}")
