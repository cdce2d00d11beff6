"""A reduction reading an elementwise chain fuses into it as the program's epilogue: which
graphs fuse, that the fused node computes what the unfused graph does (slice by slice,
uneven last slices included), how accurate its sums are against float64, and that the
chain's result is never made whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from triplane.engines.op.numpy_kernels.fused import SLICE_ELEMENTS, run_whole
from triplane.engines.registry import get_op_engine
from triplane.executor.local import run_plan
from triplane.proto.builder import Builder, Ref
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.fusion import fuse_elementwise
from triplane.scheduler.compiler.pipeline import CompileOptions, compile_graph

UNFUSED = CompileOptions(fuse=False)
# float32 results against the float64 reference, relative to the sum of the terms'
# magnitudes (the scale a float sum's rounding error is measured on): each slice is
# summed pairwise in float32, the slices' partials in float64, so the bound is a few
# float32 ulps of a slice's partial, independent of how many slices there are.
SUM_RTOL = {"float32": 1e-6, "float64": 1e-13}


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def _chain_reduce(shape: tuple[int, ...], op: str, dtype: str = "float32", **attrs: Any) -> tuple[Graph, Ref]:
    """op(exp(x * 0.5 + 0.25) * r): r broadcasts along the rows (shape[-1:])."""
    b = Builder()
    x = b.op("input", tensor="x", shape=shape, dtype=dtype)
    r = b.op("input", tensor="r", shape=shape[-1:], dtype=dtype)
    body = b.op("mul", b.op("exp", x * 0.5 + 0.25), r)
    y = b.op(op, body, **attrs)
    return b.graph([y]), y


def _data(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.uniform(-2, 2, size=shape).astype(dtype),
            "r": rng.uniform(0.5, 1.5, size=shape[-1:]).astype(dtype)}


def _reference(data: dict[str, np.ndarray], op: str, axes: Any, keepdims: bool) -> np.ndarray:
    body = np.exp(data["x"].astype(np.float64) * 0.5 + 0.25) * data["r"].astype(np.float64)
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[op]
    return fn(body, axis=axes, keepdims=keepdims)


def test_the_chain_and_its_sum_become_one_node() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(64, 128), dtype="float32")
    s = b.op("sum", b.op("exp", x * 2 + 1))
    g = fuse_elementwise(b.graph([s]))
    assert len(g) == 2 and g[s.id].op == "fused"  # the reduction's id and type
    assert [st[0] for st in g[s.id].attrs["program"]] == ["full", "mul", "full", "add", "exp", "sum"]
    assert g[s.id].shape == () and g[s.id].inputs == (x.id,)
    validate(g)


def test_a_single_elementwise_op_fuses_into_its_reduction() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(8, 8), dtype="float32")
    m = b.op("max", b.op("relu", x), axes=1)
    g = fuse_elementwise(b.graph([m]))
    assert g[m.id].op == "fused" and [st[0] for st in g[m.id].attrs["program"]] == ["relu", "max"]


def test_no_epilogue_when_the_chain_is_read_twice_or_is_an_output_or_has_no_combine() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(8, 8), dtype="float32")
    shared = b.op("exp", b.op("neg", x))
    s1, s2 = b.op("sum", shared), b.op("max", shared)     # two readers
    out = b.op("exp", b.op("sin", x))
    s3 = b.op("sum", out)                                 # its input is an output
    v = b.op("var", b.op("exp", b.op("cos", x)), axes=1)  # var has no combine
    flags = b.op("gt", x, x * 0.5)
    anyx = b.op("max", b.op("logical_not", flags))        # bool: no numeric combine
    g = fuse_elementwise(b.graph([s1, s2, s3, out, v, anyx]))
    assert g[s1.id].op == "sum" and g[s2.id].op == "max" and g[s3.id].op == "sum"
    assert g[v.id].op == "var" and g[anyx.id].op == "max"
    assert g[shared.id].op == "fused" and g[out.id].op == "fused"
    validate(g)


CASES = [  # (op, axes, keepdims)
    ("sum", None, False), ("sum", -1, False), ("sum", 0, True), ("sum", (0, 2), False),
    ("mean", None, False), ("mean", 1, True), ("mean", 0, False),
    ("max", None, False), ("max", -1, True), ("max", (0, 1), False),
    ("min", None, True), ("min", 0, False), ("min", (1, 2), False),
    ("prod", -1, False),
]


def _shapes(op: str, axes: Any) -> list[tuple[int, ...]]:
    """Bodies of several slices whose last slice is shorter (SLICE_ELEMENTS = 65536:
    517 x 301 runs as slices of 217 rows, the last of 83; 97 x 9 x 131 as 55 and 42), and
    one run whole."""
    if op == "prod":
        return [(517, 11)]  # products of 11 terms stay in range
    return [(97, 9, 131), (5, 7, 3)] if axes is None or isinstance(axes, tuple) else [(517, 301), (6, 5)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{'keep' if c[2] else 'drop'}")
def test_fused_reduction_equals_unfused_and_float64(case: tuple[str, Any, bool], dtype: str,
                                                    seed: int) -> None:
    op, axes, keepdims = case
    rng = np.random.default_rng(seed)
    eng = get_op_engine("numpy")
    for shape in _shapes(op, axes):
        g, y = _chain_reduce(shape, op, dtype, axes=axes, keepdims=keepdims)
        data = _data(shape, dtype, rng)
        fused, plain = compile_graph(g), compile_graph(g, UNFUSED)
        assert fused.graph[y.id].op == "fused" and plain.graph[y.id].op == op
        got = run_plan(fused, data, eng)[y.id]
        want = run_plan(plain, data, eng)[y.id]
        what = f"{op} axes={axes} keepdims={keepdims} {shape} {dtype} seed={seed}"
        assert got.dtype == want.dtype and got.shape == want.shape, what
        ref = _reference(data, op, axes, keepdims)
        if op in ("max", "min"):  # no accumulation: the same element wins
            np.testing.assert_array_equal(got, want, err_msg=what)
            # (the element itself carries the body's float32 rounding of exp and mul)
            np.testing.assert_allclose(got, ref, rtol=4 * np.finfo(dtype).eps, err_msg=what)
            continue
        body = np.exp(data["x"].astype(np.float64) * 0.5 + 0.25) * data["r"]
        scale = np.sum(np.abs(body), axis=axes, keepdims=keepdims)
        if op == "mean":
            scale = scale / (body.size // ref.size)
        elif op == "prod":
            scale = np.abs(ref) * shape[-1]
        tol = SUM_RTOL[dtype]
        np.testing.assert_array_less(np.abs(got - ref), tol * scale, err_msg=f"vs float64: {what}")
        # numpy's own float32 sums down axis 0 add row after row: allow it its error
        np.testing.assert_array_less(np.abs(got - want), 100 * tol * scale, err_msg=f"vs unfused: {what}")


def test_a_long_float32_sum_is_as_accurate_as_numpys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 4096
    g, y = _chain_reduce((n, n), "sum", "float32", axes=None)
    data = _data((n, n), "float32", rng)
    got = float(run_plan(compile_graph(g), data, get_op_engine("numpy"))[y.id])
    body = np.exp(data["x"] * np.float32(0.5) + np.float32(0.25)) * data["r"]  # numpy, float32
    exact = float(np.sum(body.astype(np.float64)))  # the same float32 terms, summed in float64
    numpy_err = abs(float(np.sum(body)) - exact)
    # 2^24 terms: a naive float32 sum would be ~1e-3 off; the fused one is a few ulps.
    assert abs(got - exact) <= max(2 * numpy_err, 4 * np.spacing(np.float32(exact))), (got, exact, seed)


def test_the_chains_result_is_never_made_whole(seed: int, peak_bytes: Callable[..., int]) -> None:
    shape = (1024, 2048)  # an 8 MiB float32 body
    g, _ = _chain_reduce(shape, "sum", "float32", axes=None)
    data = _data(shape, "float32", np.random.default_rng(seed))
    fused, plain = compile_graph(g), compile_graph(g, UNFUSED)
    peak = peak_bytes(fused, data)
    assert peak < 16 * SLICE_ELEMENTS * 4, f"fused peak {peak} bytes"  # a few slices' temporaries
    assert peak_bytes(plain, data) > 8 << 20


@pytest.mark.parametrize("case", [("sum", None, False), ("mean", 1, True), ("max", 0, False)])
def test_the_whole_tensor_path_of_device_engines_agrees(case: tuple[str, Any, bool], seed: int) -> None:
    """The cupy engine runs fused programs through ``run_whole``; on numpy arrays it
    must agree with the sliced kernel (the GPU itself is tested by the conformance kit)."""
    op, axes, keepdims = case
    g, y = _chain_reduce((300, 257), op, "float64", axes=axes, keepdims=keepdims)
    plan = compile_graph(g)
    node = plan.graph[y.id]
    data = _data((300, 257), "float64", np.random.default_rng(seed))
    ins = [data[plan.graph[i].attrs["tensor"]] for i in node.inputs]
    sliced = get_op_engine("numpy").run("fused", ins, node.attrs, node.type)
    whole = run_whole(ins, node.attrs, node.type, asarray=np.asarray)
    np.testing.assert_allclose(whole, sliced, rtol=1e-13, err_msg=f"seed={seed}")
