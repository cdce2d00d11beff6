"""Elementwise fusion: which chains become one `fused` node, and that fused programs
compute what the unfused graph does (slice by slice, with fewer temporaries)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from triplane.engines.op.numpy_kernels.fused import SLICE_ELEMENTS
from triplane.engines.registry import get_op_engine
from triplane.executor.local import run_plan
from triplane.proto.builder import Builder, Ref
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.fusion import fuse_elementwise
from triplane.scheduler.compiler.pipeline import CompileOptions, compile_graph
from triplane.testing import TOLERANCE, assert_close

UNFUSED = CompileOptions(fuse=False)


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def _chain(shape: tuple[int, ...], dtype: str = "float32") -> tuple[Graph, Ref]:
    """exp(x * 2 + 1) - x"""
    b = Builder()
    x = b.op("input", tensor="x", shape=shape, dtype=dtype)
    y = b.op("sub", b.op("exp", x * 2 + 1), x)
    return b.graph([y]), y


def test_chain_becomes_one_fused_node() -> None:
    g, y = _chain((4, 5))
    assert len(g) == 7  # input, two 0-d constants, mul, add, exp, sub
    out = fuse_elementwise(g)
    assert len(out) == 2
    assert out[y.id].op == "fused"  # the group keeps its root's id
    assert [s[0] for s in out[y.id].attrs["program"]] == ["full", "mul", "full", "add", "exp", "sub"]
    assert out.outputs == g.outputs
    validate(out)


def test_no_fusion_across_two_readers_or_an_output() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(3,), dtype="float32")
    shared = b.op("exp", b.op("neg", x))          # read twice below
    left, right = b.op("log", shared), b.op("neg", shared)
    out1 = b.op("add", left, right)
    seen = b.op("exp", out1)                      # an output, and read by `last`
    last = b.op("neg", b.op("log", seen))
    g = fuse_elementwise(b.graph([seen, last]))
    assert g[shared.id].op == "fused"             # neg -> exp stop at the shared value
    # log, neg, add and exp join the output `seen`'s group, which ends there: the output
    # is materialised, and `last` (log -> neg) reads it as an input
    assert out1.id not in g and left.id not in g
    assert g[seen.id].op == "fused" and g[seen.id].inputs == (shared.id,)
    assert [s[0] for s in g[seen.id].attrs["program"]] == ["log", "neg", "add", "exp"]
    assert g[last.id].op == "fused" and g[last.id].inputs == (seen.id,)
    assert len(g) == 4
    validate(g)


def test_broadcast_operands_are_external_inputs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, m = 400, 350  # 140,000 elements: the kernel runs several slices
    assert n * m > 2 * SLICE_ELEMENTS
    b = Builder()
    col = b.op("input", tensor="c", shape=(n, 1), dtype="float64")
    row = b.op("input", tensor="r", shape=(1, m), dtype="float64")
    y = b.op("exp", b.op("mul", b.op("add", col, row), b.op("neg", row)))
    g = b.graph([y])
    plan = compile_graph(g)
    assert plan.graph[y.id].op == "fused" and len(plan.graph) == 4
    # neg(row) has shape (1, m), not the result's: it is computed outside the group
    assert [s[0] for s in plan.graph[y.id].attrs["program"]] == ["add", "mul", "exp"]
    data = {"c": rng.standard_normal((n, 1)), "r": rng.standard_normal((1, m))}
    got = run_plan(plan, data, get_op_engine("numpy"))[y.id]
    assert_close(got, np.exp((data["c"] + data["r"]) * -data["r"]), "float64", what=f"seed={seed}")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (7, 3), (130, 600), (1, 40000)])
def test_fused_equals_unfused(shape: tuple[int, ...], dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g, y = _chain(shape, dtype)
    xv = rng.uniform(-2, 2, size=shape).astype(dtype)
    eng = get_op_engine("numpy")
    fused_plan, plain_plan = compile_graph(g), compile_graph(g, UNFUSED)
    if shape != (0,) and shape != (3, 0, 2):
        assert fused_plan.graph[y.id].op == "fused"
    assert plain_plan.graph[y.id].op == "sub"
    got = run_plan(fused_plan, {"x": xv}, eng)[y.id]
    plain = run_plan(plain_plan, {"x": xv}, eng)[y.id]
    # numpy rounds each float16 op to float16 in both paths, so they agree exactly
    np.testing.assert_array_equal(got, plain, err_msg=f"seed={seed}")
    x64 = xv.astype(np.float64)
    r, a = TOLERANCE[dtype]
    assert_close(got, np.exp(x64 * 2 + 1) - x64, dtype, rtol=r * 4, atol=a * 40, what=f"seed={seed}")


def test_random_and_bfloat16_values_are_not_fused() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(4,), dtype="bfloat16")
    y = b.op("exp", b.op("neg", b.op("mul", x, b.op("full", value=2.0, shape=(), dtype="bfloat16"))))
    g = b.graph([y])
    assert fuse_elementwise(g) is g
    xv = np.linspace(-1, 1, 4).astype(g[x.id].type.dtype.np)
    got = run_plan(compile_graph(g), {"x": xv}, get_op_engine("numpy"))[y.id]
    assert_close(got, np.exp(-(xv.astype(np.float64) * 2)), "bfloat16")


def test_all_constant_group_is_left_for_folding() -> None:
    b = Builder()
    c = b.op("neg", b.op("exp", b.op("full", value=1.0, shape=(), dtype="float32")))
    g = b.graph([c])
    out = fuse_elementwise(g)  # a fused node needs an input; folding handles constants
    assert out is g
    plan = compile_graph(g, CompileOptions(fold=False))
    assert run_plan(plan, {}, get_op_engine("numpy"))[c.id] == pytest.approx(-np.e)


def test_fusion_allocates_fewer_temporaries(seed: int, peak_bytes: Callable[..., int]) -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(512, 1024), dtype="float32")  # 2 MiB
    y: Ref = x
    for k in range(8):
        y = b.op("exp", b.op("neg", y * 0.5 + float(k)))
    g = b.graph([y])
    data = {"x": np.random.default_rng(seed).standard_normal((512, 1024)).astype(np.float32)}
    fused, plain = compile_graph(g), compile_graph(g, UNFUSED)
    assert len(fused.graph) == 3  # input, the shared 0-d constant 0.5 (after CSE), fused
    ratio = peak_bytes(fused, data) / peak_bytes(plain, data)
    assert ratio < 0.7, f"fused peak is {ratio:.2f} of the unfused peak"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kept_buffers_give_the_bits_of_the_kernel_path(dtype: str, seed: int) -> None:
    # _Steps runs plain ufunc steps into buffers kept across slices and computes constant
    # steps once; the general path (each step's kernel, a new array each) is the oracle.
    from triplane.engines.op.numpy_kernels.fused import _Steps
    from triplane.proto.ir import TensorType
    from triplane.proto.ops.fused import program_types

    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.op("input", tensor="x", shape=(64, 33), dtype=dtype)
    r = b.op("input", tensor="r", shape=(1, 33), dtype=dtype)
    two = b.op("full", shape=(), value=2.0, dtype=dtype)
    y = b.op("tanh", b.op("sub", b.op("exp", b.op("mul", b.op("add", x, r), two)), b.op("square", x)))
    plan = compile_graph(b.graph([y]))
    node = plan.graph[y.id]
    assert node.op == "fused"
    ins = [rng.standard_normal((64, 33)).astype(dtype) if plan.graph[i].shape == (64, 33)
           else rng.standard_normal((1, 33)).astype(dtype) for i in node.inputs]
    types = program_types([TensorType(a.shape, node.type.dtype) for a in ins], node.attrs)
    steps = _Steps(node.attrs["program"], types)
    for rows in (64, 17, 64):  # buffers reused across calls, a shorter slice in between
        part = [a[:rows] if a.shape[0] == 64 else a for a in ins]
        fast = np.array(steps.run(part, (rows, 33)))
        general = steps.run(part, (rows, 33), asarray=lambda v: v)
        np.testing.assert_array_equal(fast, general)
