"""DCE, CSE and constant folding: each a pure Graph -> Graph rewrite."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.engines.registry import get_op_engine
from triplane.executor.local import run_plan
from triplane.proto.builder import Builder
from triplane.proto.errors import KernelError
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.broadcasts import fold_broadcasts
from triplane.scheduler.compiler.cse import cse
from triplane.scheduler.compiler.dce import dce
from triplane.scheduler.compiler.fold import MAX_FOLD_ELEMENTS, fold_constants
from triplane.scheduler.compiler.pipeline import CompileOptions, compile_graph
from triplane.testing import assert_close


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def _ops(g: Graph) -> list[str]:
    return sorted(n.op for n in g.nodes.values())


def test_dce_removes_unreachable_and_keeps_outputs() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(3,), dtype="float32")
    y = b.op("exp", x)
    dead = b.op("log", b.op("neg", x))
    other = b.op("neg", y)
    g = b.graph([y, other])
    assert dead.id in g
    out = dce(g)
    assert set(out.nodes) == {x.id, y.id, other.id}
    assert out.outputs == g.outputs
    assert dce(out) is out  # nothing left to remove


def test_cse_merges_duplicates_and_keeps_distinct_inputs() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(3,), dtype="float32")
    x_again = b.op("input", tensor="x", shape=(3,), dtype="float32")  # same host tensor
    z = b.op("input", tensor="z", shape=(3,), dtype="float32")        # a different one
    e1, e2 = b.op("exp", x), b.op("exp", x_again)
    s = b.op("add", b.op("mul", e1, z), b.op("mul", e2, z))
    t = b.op("exp", z)
    g = b.graph([s, t])
    out = cse(g)
    assert len(g) == 9 and len(out) == 6
    assert _ops(out) == ["add", "exp", "exp", "input", "input", "mul"]
    add = out[s.id]
    assert add.inputs[0] == add.inputs[1]  # both operands are now the one product
    assert {n.attrs["tensor"] for n in out.nodes.values() if n.op == "input"} == {"x", "z"}
    assert out.outputs == g.outputs


def test_cse_keeps_output_ids(seed: int) -> None:
    # Regression: a merged node that is a graph output used to vanish, so a caller asking
    # for it by id found nothing.
    b = Builder()
    x = b.op("input", tensor="x", shape=(4,), dtype="float64")
    first = b.op("exp", x)
    second = b.op("exp", x)   # duplicate of first, and an output
    third = b.op("exp", x)    # another duplicate output
    user = b.op("neg", first)
    g = b.graph([second, user, third])
    out = cse(g)
    assert out.outputs == g.outputs and all(o in out for o in out.outputs)
    assert out[user.id].inputs == (second.id,)  # rewired to the output representative
    validate(out)
    xv = np.random.default_rng(seed).standard_normal(4)
    plan = compile_graph(g)
    res = run_plan(plan, {"x": xv}, get_op_engine("numpy"))
    for o, want in ((second.id, np.exp(xv)), (third.id, np.exp(xv)), (user.id, -np.exp(xv))):
        assert_close(res[o], want, "float64", what=f"seed={seed} {o}")


def test_fold_replaces_constant_subgraphs() -> None:
    b = Builder()
    two = b.op("full", value=2.0, shape=(3,), dtype="float32")
    c = b.op("exp", b.op("mul", two, b.op("full", value=0.5, shape=(), dtype="float32")))
    ramp = b.op("constant", data=_enc(np.arange(3, dtype=np.float32)), shape=(3,), dtype="float32")
    varied = b.op("add", c, ramp)
    x = b.op("input", tensor="x", shape=(3,), dtype="float32")
    y = b.op("mul", x, varied)
    g = b.graph([y, c])
    out = dce(fold_constants(g))
    assert out[c.id].op == "full" and out[c.id].attrs["value"] == pytest.approx(np.e, rel=1e-6)
    assert out[varied.id].op == "constant"
    assert out[y.id].op == "mul" and out[x.id].op == "input"  # host inputs are left alone
    assert _ops(out) == ["constant", "full", "input", "mul"]
    validate(out)


def test_fold_leaves_large_results_alone() -> None:
    b = Builder()
    big = b.op("full", value=1.0, shape=(MAX_FOLD_ELEMENTS + 1,), dtype="float32")
    e = b.op("exp", big)
    g = b.graph([e])
    assert fold_constants(g) is g


def test_fold_keeps_negative_zero_and_non_finite_as_constants() -> None:
    # Regression: a uniform -0.0 or inf result became a `full` whose value JSON cannot
    # carry (-0.0 is written as 0; inf not at all).
    b = Builder()
    z = b.op("full", value=0.0, shape=(2,), dtype="float32")
    neg_zero = b.op("neg", z)
    inf = b.op("div", b.op("full", value=1.0, shape=(2,), dtype="float32"), z)
    mixed = b.op("mul", b.op("full", value=-1.0, shape=(2,), dtype="float32"),
                 b.op("constant", data=_enc(np.array([0.0, -0.0], np.float32)), shape=(2,), dtype="float32"))
    g = fold_constants(b.graph([neg_zero, inf, mixed]))
    assert g[neg_zero.id].op == "constant" and g[inf.id].op == "constant" and g[mixed.id].op == "constant"
    back = Graph.from_json(g.to_json())
    eng = get_op_engine("numpy")
    v = eng.run("constant", [], back[neg_zero.id].attrs, back[neg_zero.id].type)
    assert np.signbit(v).all()
    assert np.isinf(eng.run("constant", [], back[inf.id].attrs, back[inf.id].type)).all()
    m = eng.run("constant", [], back[mixed.id].attrs, back[mixed.id].type)
    assert list(np.signbit(m)) == [True, False]


def test_fold_leaves_a_failing_kernel_to_run_time() -> None:
    # Regression: integer division by zero in a constant subgraph crashed compilation.
    b = Builder()
    one = b.op("full", value=1, shape=(2,), dtype="int32")
    zero = b.op("full", value=0, shape=(2,), dtype="int32")
    q = b.op("floor_divide", one, zero)
    plan = compile_graph(b.graph([q]))
    assert plan.graph[q.id].op == "floor_divide"
    with pytest.raises(KernelError, match="division by zero") as info:
        run_plan(plan, {}, get_op_engine("numpy"))
    assert info.value.node == q.id


def test_compiled_results_match_unoptimised(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.op("input", tensor="x", shape=(5, 4), dtype="float64")
    w = b.op("input", tensor="w", shape=(4, 3), dtype="float64")
    k = b.op("exp", b.op("full", value=0.25, shape=(3,), dtype="float64"))
    h = b.op("matmul", x, w)
    y = b.op("sum", b.op("add", b.op("mul", h, k), b.op("mul", h, k)), axes=[1])
    g = b.graph([y])
    xs = {"x": rng.standard_normal((5, 4)), "w": rng.standard_normal((4, 3))}
    eng = get_op_engine("numpy")
    plain = run_plan(compile_graph(g, CompileOptions(cse=False, fold=False, fuse=False)), xs, eng)
    opt = run_plan(compile_graph(g), xs, eng)
    want = (2 * (xs["x"] @ xs["w"]) * np.exp(0.25)).sum(axis=1)
    assert_close(plain[y.id], want, "float64", what=f"seed={seed}")
    assert_close(opt[y.id], want, "float64", what=f"seed={seed}")


def test_an_elementwise_op_reads_the_input_of_a_broadcast_instead(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.op("input", tensor="x", shape=(64, 32), dtype="float64")
    s = b.op("input", tensor="s", shape=(1, 32), dtype="float64")
    wide = b.op("broadcast_to", s, shape=(64, 32))
    y = b.op("sub", x, wide)
    z = b.op("matmul", b.op("transpose", x, perm=[1, 0]), wide)  # not elementwise: keeps it
    g = validate(b.graph([y, z]))
    out = dce(fold_broadcasts(g))
    assert out[y.id].inputs == (x.id, s.id)
    assert out[z.id].inputs[1] == wide.id and out[wide.id].op == "broadcast_to"
    xs = {"x": rng.standard_normal((64, 32)), "s": rng.standard_normal((1, 32))}
    got = run_plan(compile_graph(g), xs, get_op_engine("numpy"))
    assert_close(got[y.id], xs["x"] - xs["s"], "float64", what=f"seed={seed}")
    assert_close(got[z.id], xs["x"].T @ np.broadcast_to(xs["s"], (64, 32)), "float64", what=f"seed={seed}")


def test_a_broadcast_that_sets_the_result_shape_stays() -> None:
    b = Builder()
    col = b.op("input", tensor="c", shape=(8, 1), dtype="float32")
    other = b.op("input", tensor="o", shape=(8, 1), dtype="float32")
    y = b.op("add", b.op("broadcast_to", col, shape=(8, 5)), other)  # col + other is (8, 1)
    c = b.op("add", b.op("broadcast_to", col, shape=(3, 8, 1)), col)  # col alone has 2 dims
    g = validate(b.graph([y, c]))
    assert fold_broadcasts(g) is g
    out = compile_graph(g).graph
    assert sum(n.op == "broadcast_to" for n in out.nodes.values()) == 2
    b = Builder()
    col = b.op("input", tensor="c", shape=(8, 1), dtype="float32")
    row = b.op("input", tensor="r", shape=(1, 5), dtype="float32")
    r = b.op("add", b.op("broadcast_to", col, shape=(8, 5)), row)  # col + row is (8, 5): folds
    folded = dce(fold_broadcasts(validate(b.graph([r]))))
    assert folded[r.id].inputs == (col.id, row.id) and len(folded) == 3


def test_the_gradient_of_a_sum_is_not_made_as_a_broadcast_tensor(seed: int) -> None:
    import triplane as tp
    from triplane.sdk.tensor import build_graph

    rng = np.random.default_rng(seed)
    x = tp.tensor(rng.standard_normal((256, 64)).astype(np.float32))
    w = tp.tensor(rng.standard_normal((64, 16)).astype(np.float32))
    loss = ((x @ w) * (x @ w)).sum() / 256
    (g,) = tp.grad(loss, [w])
    graph, _, bindings = build_graph([g])
    assert any(n.op == "broadcast_to" for n in graph.nodes.values())  # autograd writes one
    plan = compile_graph(graph)
    assert not any(n.op == "broadcast_to" for n in plan.graph.nodes.values())
    got = run_plan(plan, {k: np.asarray(v) for k, v in bindings.items()}, get_op_engine("numpy"))
    xv, wv = (np.asarray(t.numpy(), np.float64) for t in (x, w))
    want = 2 * xv.T @ (xv @ wv) / 256
    assert_close(got[graph.outputs[0]], want, "float32", what=f"seed={seed}")


def _enc(a: np.ndarray) -> str:
    from triplane.proto.ir import encode_data

    return encode_data(a)
