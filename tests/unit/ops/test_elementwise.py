"""Elementwise ops end to end: op table -> SDK -> compiler -> numpy kernels, against
independent float64 numpy references on fresh random data; gradients against finite
differences; broadcasting inference against numpy; errors."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import triplane as tp
from triplane.engines.op.numpy_kernels.elementwise import erf as erf_kernel
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import AttrError, DTypeError, KernelError, ShapeError
from triplane.proto.ir import EMPTY_ATTRS, TensorType
from triplane.sdk.tensor import Tensor, apply
from triplane.testing import assert_close, check_grad, random_array, run_op

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int8", "int32", "int64", "uint8"]
SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 1, 3)]
BINARY_SHAPES = [((), ()), ((4,), ()), ((), (3, 2)), ((2, 3), (3,)), ((2, 1, 4), (3, 1)),
                 ((0, 3), (1, 3)), ((4, 1), (0,)), ((3, 4), (3, 4))]



_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    return np.array([1.0 / (1.0 + math.exp(-v)) for v in x.reshape(-1)]).reshape(x.shape)


# name -> (float64 reference, accepts ints, (low, high) of the inputs, keep away from 0)
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool, tuple[float, float], bool]] = {
    "neg": (np.negative, True, (-3, 3), False),
    "abs": (np.abs, True, (-3, 3), True),
    "sign": (np.sign, True, (-3, 3), True),
    "square": (lambda x: x * x, True, (-3, 3), False),
    "relu": (lambda x: np.where(x > 0, x, 0), True, (-3, 3), True),
    "floor": (np.floor, True, (-3, 3), False),
    "ceil": (np.ceil, True, (-3, 3), False),
    "exp": (np.exp, False, (-3, 3), False),
    "log": (np.log, False, (0.1, 4), False),
    "sqrt": (np.sqrt, False, (0.05, 4), False),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), False, (0.1, 4), False),
    "reciprocal": (lambda x: 1.0 / x, False, (-3, 3), True),
    "sin": (np.sin, False, (-3, 3), False),
    "cos": (np.cos, False, (-3, 3), False),
    "tan": (np.tan, False, (-1.3, 1.3), False),
    "tanh": (np.tanh, False, (-3, 3), False),
    "sigmoid": (_sigmoid64, False, (-12, 12), False),
    "silu": (lambda x: x * _sigmoid64(x), False, (-6, 6), False),
    "gelu": (lambda x: 0.5 * x * (1.0 + _erf64(x / math.sqrt(2.0))), False, (-4, 4), False),
    "erf": (_erf64, False, (-4, 4), False),
}


def _inputs(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, low: float, high: float,
            away_from_zero: bool = False) -> np.ndarray:
    x = random_array(rng, shape, dtype, low, high)
    if away_from_zero and dt.dtype(dtype).is_float:
        # |x| >= 0.1 (after rounding to the dtype), random signs: off the kinks at 0
        x = (np.sign(x.astype(np.float64)) + (x == 0)) * (0.1 + np.abs(x.astype(np.float64)))
        x = x.astype(dt.dtype(dtype).np)
    return x


def _int_ref(ref: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """Integer reference: exact in int64, then wrapped to the dtype like machine ints."""
    return np.asarray(ref(x.astype(np.int64))).astype(np.int64).astype(x.dtype)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_matches_numpy(op: str, dtype: str, seed: int) -> None:
    ref, ints_ok, (low, high), away = UNARY[op]
    is_int = dtype in INTS
    if is_int and not ints_ok:
        x = np.ones((2,), dt.dtype(dtype).np)
        with pytest.raises(DTypeError, match=dtype):
            run_op(op, [x])
        return
    rng = np.random.default_rng(seed)
    for shape in SHAPES:
        x = _inputs(rng, shape, dtype, low, high, away)
        got = run_op(op, [x])
        assert got.dtype == x.dtype, f"{op} changed {dtype} to {got.dtype} (seed={seed})"
        want = _int_ref(ref, x) if is_int else ref(x.astype(np.float64))
        assert_close(got, want, dtype, what=f"{op} {dtype}{list(shape)} seed={seed}")


def _binary_ref(op: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return {
        "add": np.add, "sub": np.subtract, "mul": np.multiply,
        "div": np.true_divide, "floor_divide": np.floor_divide, "remainder": np.remainder,
        "pow": lambda x, y: np.array([a ** b for a, b in zip(*(np.broadcast_arrays(x, y)[i].reshape(-1)
                                                              for i in (0, 1)))],
                                     dtype=x.dtype).reshape(np.broadcast_shapes(x.shape, y.shape)),
        "maximum": lambda x, y: np.where(x >= y, x, y), "minimum": lambda x, y: np.where(x <= y, x, y),
        "eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
        "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y,
        "logical_and": lambda x, y: x & y, "logical_or": lambda x, y: x | y,
    }[op]


def _binary_inputs(op: str, rng: np.random.Generator, shapes: tuple[tuple[int, ...], ...],
                   dtype: str) -> tuple[np.ndarray, np.ndarray]:
    sx, sy = shapes
    is_int = dtype in INTS
    if op in ("div", "floor_divide", "remainder"):
        x = random_array(rng, sx, dtype, 0 if dtype == "uint8" else -9, 9)
        y = random_array(rng, sy, dtype, 1, 4)
        if not is_int or dtype != "uint8":
            y = (y * np.where(rng.random(sy) < 0.5, -1, 1).astype(y.dtype)).astype(y.dtype)
        if op != "div" and not is_int:
            # halves: floor(x / y) and x % y are then exact in every float dtype, and the
            # quotient lands on integers (where rounding down is decided) often
            x = (np.round(x.astype(np.float64) * 2) / 2).astype(x.dtype)
            y = (np.round(y.astype(np.float64) * 2) / 2).astype(y.dtype)
        return x, y
    if op == "pow":
        if is_int:
            return random_array(rng, sx, dtype, 0, 3), random_array(rng, sy, dtype, 0, 3)
        return random_array(rng, sx, dtype, 0.5, 2), random_array(rng, sy, dtype, -2, 2)
    x = random_array(rng, sx, dtype, -4, 4)
    y = random_array(rng, sy, dtype, -4, 4)
    if not is_int and dtype != "bool":
        # halves: ties between x and y happen (comparisons, maximum/minimum)
        x = (np.round(x.astype(np.float64) * 2) / 2).astype(x.dtype)
        y = (np.round(y.astype(np.float64) * 2) / 2).astype(y.dtype)
    return x, y


BINARY_DTYPES = {
    **{op: FLOATS + INTS for op in ("add", "sub", "mul", "floor_divide", "remainder", "pow", "maximum",
                                    "minimum")},
    "div": FLOATS,
    **{op: [*FLOATS, *INTS, "bool"] for op in ("eq", "ne", "lt", "le", "gt", "ge")},
    "logical_and": ["bool"], "logical_or": ["bool"],
}


@pytest.mark.parametrize(("op", "dtype"), [(op, d) for op, ds in BINARY_DTYPES.items() for d in ds])
def test_binary_matches_numpy(op: str, dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref = _binary_ref(op)
    for shapes in BINARY_SHAPES:
        x, y = _binary_inputs(op, rng, shapes, dtype)
        got = run_op(op, [x, y])
        if dtype in FLOATS and op not in BINARY_DTYPES["eq"]:
            want = ref(x.astype(np.float64), y.astype(np.float64))
        else:
            want = ref(x, y)
        assert got.shape == np.broadcast_shapes(*shapes), f"{op} {shapes} seed={seed}"
        assert_close(got, want, got.dtype.name, what=f"{op} {dtype} {shapes} seed={seed}")


@pytest.mark.parametrize("dtype", ["bool", "float16", "bfloat16", "float64", "int32"])
def test_where_matches_numpy(dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for sc, sx, sy in [((), (), ()), ((3,), (2, 3), ()), ((2, 1), (1, 4), (4,)),
                       ((0, 2), (1, 2), (2,)), ((2, 3), (2, 3), (2, 3))]:
        c = random_array(rng, sc, "bool")
        x, y = random_array(rng, sx, dtype), random_array(rng, sy, dtype)
        got = run_op("where", [c, x, y])
        assert_close(got, np.where(c, x, y), dtype, what=f"where {sc} {sx} {sy} seed={seed}")


def test_logical_not_matches_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for shape in SHAPES:
        x = random_array(rng, shape, "bool")
        np.testing.assert_array_equal(run_op("logical_not", [x]), ~x, err_msg=f"seed={seed}")


def test_erf_kernel_is_accurate_to_double_precision(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal(3000) * 3, rng.uniform(-30, 30, 3000),
                        rng.uniform(2.4, 2.6, 500), 10.0 ** rng.uniform(-300, 0, 500),
                        [0.0, -0.0, 5e-324, 2.5, -2.5, 6.0, 26.0, np.inf, -np.inf]])
    got = erf_kernel(x)
    want = _erf64(x)
    np.testing.assert_allclose(got, want, rtol=4e-15, atol=0, err_msg=f"seed={seed}")
    assert np.isnan(erf_kernel(np.array([np.nan]))[0])
    assert np.signbit(erf_kernel(np.array([-0.0]))[0])


def test_gelu_keeps_relative_accuracy_in_the_negative_tail() -> None:
    x = np.array([-5.0, -10.0, -20.0, -30.0])
    want = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x])
    np.testing.assert_allclose(run_op("gelu", [x]), want, rtol=1e-13)


def test_nan_propagates(seed: int) -> None:
    x = np.array([np.nan, 1.0])
    for op in ("relu", "sigmoid", "gelu", "erf", "sign", "abs", "tanh", "silu"):
        assert np.isnan(run_op(op, [x])[0]), op
    for op in ("maximum", "minimum"):
        assert np.isnan(run_op(op, [x, np.array([0.0, 0.0])])[0]), op


def test_fused_chains_give_the_same_values_sliced(seed: int) -> None:
    """A chain of elementwise ops becomes one fused node that runs slice by slice; the
    result must equal the op-by-op reference (larger than one slice, with broadcasting)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (300, 200)).astype(np.float32)
    b = rng.uniform(-2, 2, (200,)).astype(np.float32)
    xt, bt = tp.tensor(x), tp.tensor(b)
    y = tp.where(xt > bt, tp.gelu(xt * 2.0), tp.maximum(tp.sin(xt), bt)) + tp.sigmoid(bt)
    x64, b64 = x.astype(np.float64), b.astype(np.float64)
    gelu = 0.5 * (2 * x64) * (1.0 + _erf64(2 * x64 / math.sqrt(2.0)))
    want = np.where(x64 > b64, gelu, np.maximum(np.sin(x64), b64)) + _sigmoid64(b64)
    assert_close(y.numpy(), want, "float32", rtol=1e-5, atol=1e-5, what=f"seed={seed}")


# --- gradients ------------------------------------------------------------------------------

DIFFERENTIABLE = ["neg", "abs", "sign", "square", "relu", "floor", "ceil", "exp", "log", "sqrt",
                  "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid", "silu", "gelu",
                  "erf"]


@pytest.mark.parametrize("op", DIFFERENTIABLE)
def test_unary_gradient(op: str, seed: int) -> None:
    _, _, (low, high), away = UNARY[op]
    rng = np.random.default_rng(seed)
    x = _inputs(rng, (2, 3), "float64", low, high, away or op in ("floor", "ceil"))
    if op in ("floor", "ceil"):
        x = x + 0.25 - (x % 1) * 0.5  # away from the integers, where the steps are
    try:
        check_grad(lambda t: apply(op, [t]), [x])
    except AssertionError as e:
        raise AssertionError(f"{op} seed={seed}: {e}") from None


def test_sign_floor_ceil_have_zero_gradient() -> None:
    x = tp.tensor(np.array([-1.5, 0.0, 2.0]), requires_grad=True)
    for op in ("sign", "floor", "ceil"):
        (g,) = tp.grad(apply(op, [x]).sum(), [x])
        np.testing.assert_array_equal(g.numpy(), [0.0, 0.0, 0.0])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "floor_divide", "remainder", "pow",
                                "maximum", "minimum"])
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2,))])
def test_binary_gradient(op: str, shapes: tuple[tuple[int, ...], ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    if op == "pow":
        x, y = rng.uniform(0.5, 2, shapes[0]), rng.uniform(-2, 2, shapes[1])
    else:
        x, y = rng.uniform(-2, 2, shapes[0]), rng.uniform(-2, 2, shapes[1])
        if op in ("div", "floor_divide", "remainder"):
            y = np.sign(y) * (0.5 + np.abs(y))  # (x / y is then an integer with probability 0)
    try:
        check_grad(lambda a, b: apply(op, [a, b]), [x, y])
    except AssertionError as e:
        raise AssertionError(f"{op} {shapes} seed={seed}: {e}") from None


def test_pow_gradient_wrt_exponent_is_zero_at_zero_base() -> None:
    x = tp.tensor(np.array([0.0, 2.0]), requires_grad=True)
    y = tp.tensor(np.array([2.0, 3.0]), requires_grad=True)
    gx, gy = tp.grad(tp.pow(x, y).sum(), [x, y])
    np.testing.assert_allclose(gx.numpy(), [0.0, 12.0])
    np.testing.assert_allclose(gy.numpy(), [0.0, 8.0 * math.log(2.0)])


@pytest.mark.parametrize(("op", "share"), [("maximum", "gt"), ("minimum", "lt")])
def test_maximum_minimum_split_ties_evenly(op: str, share: str) -> None:
    xv = np.array([1.0, 2.0, 3.0, -1.0])
    yv = np.array([1.0, 5.0, 0.0, -1.0])
    x = tp.tensor(xv, requires_grad=True)
    y = tp.tensor(yv, requires_grad=True)
    gx, gy = tp.grad(apply(op, [x, y]).sum(), [x, y])
    picked_x = (xv > yv) if share == "gt" else (xv < yv)
    want_x = np.where(xv == yv, 0.5, picked_x.astype(float))
    np.testing.assert_array_equal(gx.numpy(), want_x)
    np.testing.assert_array_equal(gy.numpy(), 1.0 - want_x)


def test_where_gradient(seed: int) -> None:
    rng = np.random.default_rng(seed)
    c = rng.random((2, 3)) < 0.5
    x, y = rng.standard_normal((2, 1)), rng.standard_normal((3,))
    check_grad(lambda ct, xt, yt: tp.where(ct, xt * xt, yt), [c, x, y])
    xt, yt = tp.tensor(x, requires_grad=True), tp.tensor(y, requires_grad=True)
    gx, gy = tp.grad(tp.where(tp.tensor(c), xt, yt).sum(), [xt, yt])
    np.testing.assert_array_equal(gx.numpy(), c.sum(axis=1, keepdims=True), err_msg=f"seed={seed}")
    np.testing.assert_array_equal(gy.numpy(), (~c).sum(axis=0), err_msg=f"seed={seed}")


@pytest.mark.parametrize("op", ["sigmoid", "tanh", "gelu", "erf", "silu", "sqrt"])
def test_second_derivative(op: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.2, 2, (3,))

    def first(t: Tensor) -> Tensor:
        return tp.grad(apply(op, [t]).sum(), [t])[0]

    check_grad(first, [x])


# --- shape inference ------------------------------------------------------------------------

_dims = st.lists(st.sampled_from([0, 1, 2, 3]), max_size=4).map(tuple)


def _numpy_broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None


@settings(max_examples=150, deadline=None)
@given(sx=_dims, sy=_dims, op=st.sampled_from(["add", "pow", "maximum", "lt", "logical_or"]))
def test_binary_inference_is_numpy_broadcasting(sx: tuple[int, ...], sy: tuple[int, ...], op: str) -> None:
    d = dt.bool_ if op == "logical_or" else dt.float32
    opdef = optable.get(op)
    want = _numpy_broadcast(sx, sy)
    if want is None:
        with pytest.raises(ShapeError, match=r"do not broadcast"):
            opdef.check([TensorType(sx, d), TensorType(sy, d)], EMPTY_ATTRS)
    else:
        out = opdef.check([TensorType(sx, d), TensorType(sy, d)], EMPTY_ATTRS)
        assert out.shape == want
        assert out.dtype == (dt.bool_ if op in ("lt", "logical_or") else d)


@settings(max_examples=100, deadline=None)
@given(sc=_dims, sx=_dims, sy=_dims)
def test_where_inference_is_numpy_broadcasting(sc: tuple[int, ...], sx: tuple[int, ...],
                                               sy: tuple[int, ...]) -> None:
    opdef = optable.get("where")
    ins = [TensorType(sc, dt.bool_), TensorType(sx, dt.int32), TensorType(sy, dt.int32)]
    want = _numpy_broadcast(sc, sx, sy)
    if want is None:
        with pytest.raises(ShapeError):
            opdef.check(ins, EMPTY_ATTRS)
    else:
        assert opdef.check(ins, EMPTY_ATTRS) == TensorType(want, dt.int32)


# --- the SDK surface ------------------------------------------------------------------------


def test_operators_map_to_the_ops() -> None:
    x = tp.tensor(np.array([-2.0, 0.5, 3.0]))
    assert (x == 0.5).op == "eq" and (x != 0.5).op == "ne" and (x < 1).op == "lt"
    assert (x <= 1).op == "le" and (x > 1).op == "gt" and (x >= 1).op == "ge"
    assert (x ** 2).op == "pow" and (2 ** x).op == "pow" and abs(x).op == "abs"
    m = x > 0
    assert (m & (x < 1)).op == "logical_and" and (m | m).op == "logical_or" and (~m).op == "logical_not"
    np.testing.assert_array_equal((m & (x < 1)).numpy(), [False, True, False])
    np.testing.assert_allclose((2 ** x).numpy(), 2.0 ** np.array([-2.0, 0.5, 3.0]), rtol=1e-6)


def test_sdk_promotes_and_takes_scalars() -> None:
    i = tp.tensor(np.array([1, 2, 3], dtype=np.int32))
    assert tp.maximum(i, 2).dtype == tp.int32
    assert tp.maximum(i, 2.5).dtype == tp.float64  # NEP 50: a float scalar beside ints
    assert tp.pow(i, 2).dtype == tp.int32 and (i ** 0.5).dtype == tp.float64
    assert tp.sqrt(i).dtype == tp.float64  # float-only functions cast int32 as numpy does
    assert tp.sqrt(i.astype("int8")).dtype == tp.float16
    np.testing.assert_allclose(tp.sqrt(i).numpy(), np.sqrt([1, 2, 3]), rtol=1e-15)
    w = tp.where(i > 1, i, 0.5)
    assert w.dtype == tp.float64
    np.testing.assert_array_equal(w.numpy(), [0.5, 2.0, 3.0])
    h = tp.tensor(np.array([1.0], dtype=np.float16))
    assert tp.minimum(h, tp.tensor(np.array([2.0]))).dtype == tp.float64


def test_every_sdk_function_is_exported() -> None:
    for name in [*UNARY, "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt",
                 "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "where"]:
        assert callable(getattr(tp, name)), name
        assert name in tp.__all__, name


# --- errors -----------------------------------------------------------------------------------


def test_mixed_dtypes_in_the_ir_name_both() -> None:
    a = Tensor.from_array(np.ones(3, np.float32))
    b = Tensor.from_array(np.ones(3, np.int32))
    for op in ("add", "maximum", "eq"):
        with pytest.raises(DTypeError, match=r"float32 and int32"):
            apply(op, [a, b])
    with pytest.raises(DTypeError, match=r"float32 and int32"):
        apply("where", [Tensor.from_array(np.ones(3, bool)), a, b])
    with pytest.raises(DTypeError, match=r"condition has dtype float32"):
        apply("where", [a, a, a])


def test_logical_ops_need_bools() -> None:
    f = Tensor.from_array(np.ones(3, np.float32))
    for op, ins in (("logical_and", [f, f]), ("logical_or", [f, f]), ("logical_not", [f])):
        with pytest.raises(DTypeError, match=r"float32.*accepted: bool"):
            apply(op, ins)
    with pytest.raises(DTypeError, match=r"& needs bool tensors, got float32"):
        _ = f & f
    with pytest.raises(DTypeError, match=r"\| needs bool tensors, got int64"):
        _ = (f > 0) | 1
    with pytest.raises(DTypeError, match=r"~ needs bool tensors"):
        _ = ~f


def test_logical_functions_take_truth_values_like_numpy() -> None:
    x = np.array([0.0, -1.5, np.nan, 2.0], np.float32)
    y = np.array([3, 0, 1, 0], np.int8)
    f, i = tp.tensor(x), tp.tensor(y)
    np.testing.assert_array_equal(tp.logical_and(f, i).numpy(), np.logical_and(x, y))
    np.testing.assert_array_equal(tp.logical_or(f, 0).numpy(), np.logical_or(x, 0))
    np.testing.assert_array_equal(tp.logical_not(i).numpy(), np.logical_not(y))
    np.testing.assert_array_equal(tp.where(i, f, 7).numpy(), np.where(y, x, 7))


def test_float_only_ops_reject_ints_in_the_ir() -> None:
    i = Tensor.from_array(np.ones(3, np.int64))
    for op in ("sqrt", "sigmoid", "erf", "gelu", "exp"):
        with pytest.raises(DTypeError, match=r"int64"):
            apply(op, [i])


def test_unknown_attribute_is_an_attr_error() -> None:
    a = Tensor.from_array(np.ones(3, np.float32))
    with pytest.raises(AttrError, match=r"unknown attribute\(s\) \['alpha'\]"):
        apply("relu", [a], alpha=0.1)
    with pytest.raises(AttrError, match=r"unknown attribute"):
        apply("add", [a, a], axis=0)


def test_bad_shapes_name_them() -> None:
    a = Tensor.from_array(np.ones((2, 3)))
    b = Tensor.from_array(np.ones((4,)))
    with pytest.raises(ShapeError, match=r"\(2, 3\) and \(4,\)"):
        tp.add(a, b)


@pytest.mark.parametrize(("fn", "words"), [(lambda x, y: x // y, "division by zero"),
                                           (lambda x, y: x % y, "remainder by zero")])
def test_integer_division_by_zero_is_a_user_kernel_error(fn: Callable[[Tensor, Tensor], Tensor],
                                                         words: str) -> None:
    x = tp.tensor(np.array([4, 5], dtype=np.int32))
    y = tp.tensor(np.array([2, 0], dtype=np.int32))
    with pytest.raises(KernelError, match=words) as info:
        fn(x, y).numpy()
    assert info.value.kind == "user" and info.value.op in ("floor_divide", "remainder", "fused")
    # true division of integers is float64, as numpy's: inf and nan, no error
    np.testing.assert_array_equal((x / y).numpy(), [2.0, np.inf])


def test_integer_pow_with_negative_exponent_is_a_user_kernel_error() -> None:
    x = tp.tensor(np.array([2, 3], dtype=np.int64))
    with pytest.raises(KernelError, match=r"negative exponent") as info:
        tp.pow(x, tp.tensor(np.array([1, -1]))).numpy()
    assert info.value.kind == "user"


def test_float_division_by_zero_follows_ieee() -> None:
    got = run_op("div", [np.array([1.0, -1.0, 0.0]), np.array([0.0, 0.0, 0.0])])
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


def test_a_fused_step_reads_its_operand_rounded_to_the_operands_dtype() -> None:
    # Regression (found by test_differential.py): gelu of float16 computes in float64; in a
    # fused chain the next step read that float64 value instead of the float16 the graph says.
    x = np.array([1.712890625, -0.3, 2.5], np.float16)
    chain = (tp.gelu(tp.tensor(x)).astype("float64") * 6).numpy()
    step_by_step = tp.gelu(tp.tensor(x)).numpy().astype(np.float64) * 6
    np.testing.assert_array_equal(chain, step_by_step)
