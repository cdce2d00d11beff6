"""The numpy engine's ``bind``: a node's kernel call prepared once gives what ``run``
gives, errors included; the kernel list built on it (executor/local.py)."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.engines.registry import get_op_engine
from triplane.executor.local import KernelList
from triplane.proto import dtypes as dt
from triplane.proto.builder import Builder
from triplane.proto.errors import KernelError
from triplane.proto.ir import Attrs, TensorType
from triplane.scheduler.compiler.pipeline import compile_graph


@pytest.fixture
def engine():  # type: ignore[no-untyped-def]
    return get_op_engine("numpy")


def _both(engine, op: str, ins: list[np.ndarray], attrs: Attrs, out: TensorType):  # type: ignore[no-untyped-def]
    with np.errstate(all="ignore"):
        bound = engine.bind(op, attrs, out, [TensorType(x.shape, dt.dtype(x.dtype)) for x in ins])(ins)
    return bound, engine.run(op, ins, attrs, out)


def test_bound_calls_give_runs_values_and_dtypes(engine) -> None:  # type: ignore[no-untyped-def]
    x = np.array([1.0, -2.0, 0.0], np.float32)
    for op, ins, attrs, out in [
        ("exp", [x], Attrs(), TensorType((3,), dt.float32)),
        ("div", [x, x], Attrs(), TensorType((3,), dt.float32)),  # 0/0: nan, no warning
        ("sigmoid", [x.astype(np.float16)], Attrs(), TensorType((3,), dt.float16)),  # rounded back
        ("add", [x.astype(dt.bfloat16.np), x.astype(dt.bfloat16.np)], Attrs(),
         TensorType((3,), dt.bfloat16)),  # computed in float32
        ("sum", [x], Attrs({"axes": None, "keepdims": False}), TensorType((), dt.float32)),
        # a small fused program (its preparer plans it once), with a constant and an epilogue
        ("fused", [x, x], Attrs({"program": [["full", [], {"value": 0.5, "shape": [], "dtype": "float32"}],
                                             ["mul", [0, 2], {}], ["div", [3, 1], {}],
                                             ["sqrt", [4], {}]]}), TensorType((3,), dt.float32)),
        ("fused", [x], Attrs({"program": [["exp", [0], {}],
                                          ["sum", [1], {"axes": None, "keepdims": False}]]}),
         TensorType((), dt.float32)),
    ]:
        bound, ran = _both(engine, op, ins, attrs, out)
        assert bound.dtype == ran.dtype == out.dtype.np and bound.shape == ran.shape == out.shape, op
        np.testing.assert_array_equal(bound, ran, err_msg=op)


def test_bound_calls_raise_runs_errors(engine) -> None:  # type: ignore[no-untyped-def]
    ints = np.array([1, 2], np.int64)
    zero = np.array([1, 0], np.int64)
    out = TensorType((2,), dt.int64)
    with pytest.raises(KernelError, match="by zero") as bound:
        engine.bind("floor_divide", Attrs(), out, [out, out])([ints, zero])
    with pytest.raises(KernelError, match="by zero") as ran:
        engine.run("floor_divide", [ints, zero], Attrs(), out)
    assert str(bound.value) == str(ran.value)
    assert engine.bind("no-such-op", Attrs(), out, []) is None  # run() says so when it runs


def test_a_kernel_list_makes_constants_once_and_replays_new_inputs(engine) -> None:  # type: ignore[no-untyped-def]
    b = Builder()
    x = b.op("input", tensor="x", shape=(3,), dtype="float32")
    c = b.op("full", value=2.5, shape=(3,), dtype="float32")
    y = b.op("matmul", b.op("reshape", b.op("mul", x, c), shape=(1, 3)), b.op("reshape", c, shape=(3, 1)))
    kl = KernelList(compile_graph(b.graph([y, c])), engine)
    for v in (1.0, -4.0):
        out = kl.run({"x": np.full(3, v, np.float32)})
        np.testing.assert_array_equal(out[y.id], [[v * 2.5 * 2.5 * 3]])
        np.testing.assert_array_equal(out[c.id], 2.5)
        assert not out[c.id].flags.writeable  # one array shared by every run: read-only
    with pytest.raises(KernelError, match="bound data is float64"):
        kl.run({"x": np.ones(3)})
    with pytest.raises(KernelError, match="no data bound"):
        kl.run({})
