"""The ops of the differential test (test_differential.py), each with numpy's meaning.

An :class:`Op` pairs a triplane call with the numpy call that means the same thing. Both
are called with the same operands (numpy arrays on the numpy side, Tensors on triplane's,
Python and numpy scalars as they are) and the same keyword parameters. numpy's call
gives the expected dtype and, for integer and bool results, the expected values; float
values are compared with the numpy call on operands widened to float64 (so a float16
sum is held to the float64 sum, not to numpy's float16 accumulation).

Where triplane deliberately differs from numpy, the numpy side is wrapped so that it
states triplane's contract; :data:`EXCLUSIONS` lists each such place with its reason,
and docs/concepts.md ("dtypes and promotion") says the same to users.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import triplane as tp

EXCLUSIONS: dict[str, str] = {
    "integer // and % by zero": "raise KernelError when the graph runs (numpy returns 0 with a "
                                "warning): no engine should make up a number",
    "sum and prod of uint8": "count in int64 (numpy: uint64, which triplane does not have)",
    "var with N - ddof <= 0": "raises ShapeError (numpy returns nan or inf with a warning)",
    "reciprocal of integers": "is 1 / x in the float exp would give (numpy's np.reciprocal of "
                              "integers is integer division: 0 for |x| > 1)",
    "&, |, ~ on non-bools": "raise DTypeError: numpy's are bitwise there, which triplane does "
                            "not have (logical_and/or/not take any dtype, as numpy's)",
    "bool ** 2": "is int64, as numpy.power gives (numpy's ** operator takes a square() fast "
                 "path for the exponent 2, which gives int8 for bools); so ** is held to np.power",
    "where with a Python int out of the result's range": "raises OverflowError, as numpy's "
                                                         "arithmetic does (numpy's where wraps it)",
    "float -> integer casts of nan, inf or out-of-range values": "undefined in C, so in numpy "
                                                                 "too: only the dtype is compared",
    "functions numpy does not have": "sigmoid, silu, gelu, erf, relu, logsumexp, softmax, "
                                     "log_softmax: float64 formulas, dtypes as numpy's float "
                                     "functions; relu of bools is refused (relu is for numbers)",
    "not generated": "bfloat16 (numpy has no bfloat16 of its own; ml_dtypes' promotion is not "
                     "NEP 50's); random ops (triplane's counter-based RNG is not numpy's: "
                     "test_creation.py); nn ops (PyTorch is their oracle: test_nn.py, "
                     "test_conv.py); creation defaults (float32, PyTorch's)",
}

NUMERIC = ("int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")
EVERY = ("bool", *NUMERIC)


class Refused(Exception):
    """Raised by a numpy reference where triplane's contract is to raise (EXCLUSIONS)."""


def float_dtype(d: np.dtype) -> np.dtype:
    """numpy's float for a float function of ``d`` (np.exp's result dtype)."""
    return np.exp(np.zeros((), d)).dtype


def _float_fn(formula: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], np.ndarray]:
    """A function numpy does not have: ``formula`` over x cast to numpy's float for it."""

    def ref(x: np.ndarray, **kw: Any) -> np.ndarray:
        xf = np.asarray(x).astype(float_dtype(np.asarray(x).dtype))
        return np.asarray(formula(xf, **kw)).astype(xf.dtype)

    return ref


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _int_divisor_guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    def ref(x: Any, y: Any) -> Any:
        out = fn(x, y)
        if np.asarray(out).dtype.kind in "iub" and np.asarray(out).size and np.any(np.asarray(y) == 0):
            raise Refused("integer division by zero")
        return out

    return ref


def _bools_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    def ref(*xs: Any) -> Any:
        if any(np.asarray(x).dtype != np.bool_ for x in xs):
            raise Refused("& | ~ of non-bools")
        return fn(*xs)

    return ref


def _where(c: Any, x: Any, y: Any) -> Any:
    out = np.where(c, x, y)
    info = np.iinfo(out.dtype) if out.dtype.kind in "iu" else None
    if info is not None and any(type(v) is int and not info.min <= v <= info.max for v in (x, y)):
        raise Refused("where: Python int out of range")
    return out


def _lse(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True) if x.size else np.zeros((1,) * x.ndim)
    m = np.where(np.isfinite(m), m, 0)
    s = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return s if keepdims else np.squeeze(s, axis=axis) if axis is not None else s.reshape(())


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    return np.exp(_log_softmax(x, axis))


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def _counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    def ref(x: np.ndarray, **kw: Any) -> Any:
        out = np.asarray(fn(x, **kw))
        return out.astype(np.int64) if out.dtype == np.uint64 else out

    return ref


def _var(x: np.ndarray, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
    axes = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    if math.prod(x.shape[a] for a in axes) - ddof <= 0:
        raise Refused("var without degrees of freedom")
    return np.var(x, axis=axis, keepdims=keepdims, ddof=ddof)


Params = Callable[[np.random.Generator, tuple[int, ...]], dict[str, Any]]


def _none(rng: np.random.Generator, shape: tuple[int, ...]) -> dict[str, Any]:
    return {}


def _reduce_params(rng: np.random.Generator, shape: tuple[int, ...], single: bool = False) -> dict[str, Any]:
    nd = len(shape)
    pick = rng.integers(3) if nd else 0
    if pick == 0:
        axis: Any = None
    elif pick == 1 or single:
        axis = int(rng.integers(-nd, nd))
    else:
        axis = tuple(int(a) for a in rng.choice(nd, size=int(rng.integers(1, nd + 1)), replace=False))
    return {"axis": axis, "keepdims": bool(rng.random() < 0.4), "torch": bool(rng.random() < 0.5)}


def _axis_param(rng: np.random.Generator, shape: tuple[int, ...]) -> dict[str, Any]:
    return {"axis": int(rng.integers(-len(shape), len(shape))), "torch": bool(rng.random() < 0.5)}


def _reduction(name: str) -> Callable[..., Any]:
    def call(x: Any, axis: Any = None, keepdims: bool = False, torch: bool = False, **kw: Any) -> Any:
        if torch:
            return getattr(x, name)(dim=axis, keepdim=keepdims, **kw)
        return getattr(tp, name)(x, axis=axis, keepdims=keepdims, **kw)

    return call


def _along(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(x: Any, axis: int, torch: bool = False) -> Any:
        return fn(x, dim=axis) if torch else fn(x, axis=axis)

    return call


@dataclass(frozen=True)
class Op:
    """One op of the catalogue. ``kind``: "elementwise" (operands broadcast; Python
    scalars may stand in when ``scalars``), "reduce" (over ``axis``; the tolerance scales
    with the count), "matmul", or "shape" (values exact). ``dtypes``: the operand dtypes
    it is generated for. ``params`` draws keyword parameters; the key ``torch`` picks
    PyTorch's spelling on the triplane side and is not passed to numpy. ``native``:
    float values are held to numpy's own result rather than to the float64 one (steps that
    round to integers, where a float64 quotient can land on the other side of one; the
    numpy engine computes them in the operands' dtype, as numpy does)."""

    name: str
    arity: int
    tp: Callable[..., Any]
    np: Callable[..., Any]
    kind: str = "elementwise"
    scalars: bool = False
    dtypes: tuple[str, ...] = EVERY
    params: Params = field(default=_none)
    needs_ndim: int = 0
    native: bool = False


def _same(f: Callable[..., Any], **kw: Any) -> dict[str, Any]:
    return {"tp": f, "np": f, **kw}


OPS: list[Op] = [
    # Python operators: the same lambda runs on Tensors and on numpy arrays
    Op("+", 2, **_same(lambda a, b: a + b), scalars=True),
    Op("-", 2, **_same(lambda a, b: a - b), scalars=True),
    Op("*", 2, **_same(lambda a, b: a * b), scalars=True),
    Op("/", 2, **_same(lambda a, b: a / b), scalars=True),
    Op("//", 2, tp=lambda a, b: a // b, np=_int_divisor_guard(lambda a, b: a // b), scalars=True,
       native=True),
    Op("%", 2, tp=lambda a, b: a % b, np=_int_divisor_guard(lambda a, b: a % b), scalars=True,
       native=True),
    Op("**", 2, tp=lambda a, b: a ** b, np=np.power, scalars=True),
    *[Op(sym, 2, **_same(f), scalars=True) for sym, f in [
        ("<", lambda a, b: a < b), ("<=", lambda a, b: a <= b), (">", lambda a, b: a > b),
        (">=", lambda a, b: a >= b), ("==", lambda a, b: a == b), ("!=", lambda a, b: a != b)]],
    Op("&", 2, tp=lambda a, b: a & b, np=_bools_only(lambda a, b: a & b), scalars=True),
    Op("|", 2, tp=lambda a, b: a | b, np=_bools_only(lambda a, b: a | b), scalars=True),
    Op("~", 1, tp=lambda a: ~a, np=_bools_only(lambda a: ~a)),
    Op("neg", 1, **_same(lambda a: -a)),
    Op("abs()", 1, **_same(lambda a: abs(a))),
    # functions
    *[Op(n, 2, tp=getattr(tp, n), np=getattr(np, m), scalars=True) for n, m in [
        ("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("div", "true_divide"),
        ("pow", "power"), ("maximum", "maximum"), ("minimum", "minimum"), ("logical_and", "logical_and"),
        ("logical_or", "logical_or"), ("eq", "equal"), ("lt", "less"), ("ge", "greater_equal")]],
    Op("floor_divide", 2, tp=tp.floor_divide, np=_int_divisor_guard(np.floor_divide), scalars=True,
       native=True),
    Op("remainder", 2, tp=tp.remainder, np=_int_divisor_guard(np.remainder), scalars=True, native=True),
    Op("where", 3, tp=tp.where, np=_where, scalars=True),
    *[Op(n, 1, tp=getattr(tp, n), np=getattr(np, n)) for n in [
        "abs", "sign", "square", "floor", "ceil", "exp", "log", "sqrt", "sin", "cos", "tan", "tanh",
        "logical_not"]],
    Op("neg()", 1, tp=tp.neg, np=np.negative),
    Op("rsqrt", 1, tp=tp.rsqrt, np=lambda x: 1 / np.sqrt(x)),
    Op("reciprocal", 1, tp=tp.reciprocal, np=_float_fn(lambda x: 1 / x)),
    Op("sigmoid", 1, tp=tp.sigmoid, np=_float_fn(_sigmoid)),
    Op("silu", 1, tp=tp.silu, np=_float_fn(lambda x: x * _sigmoid(x))),
    Op("gelu", 1, tp=tp.gelu, np=_float_fn(lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))))),
    Op("erf", 1, tp=tp.erf, np=_float_fn(_erf)),
    Op("relu", 1, tp=tp.relu, np=lambda x: np.maximum(x, np.zeros((), np.asarray(x).dtype)), dtypes=NUMERIC),
    *[Op(f"astype({d})", 1, tp=lambda x, d=d: x.astype(d), np=lambda x, d=d: np.asarray(x).astype(d))
      for d in EVERY],
    # reductions
    *[Op(n, 1, tp=_reduction(n), np=_counted(getattr(np, n)), kind="reduce", params=_reduce_params)
      for n in ("sum", "prod")],
    *[Op(n, 1, tp=_reduction(n), np=getattr(np, n), kind="reduce", params=_reduce_params)
      for n in ("mean", "max", "min")],
    Op("var", 1, tp=_reduction("var"), np=_var, kind="reduce",
       params=lambda r, s: {**_reduce_params(r, s), "ddof": int(r.integers(2))}),
    Op("logsumexp", 1, tp=_reduction("logsumexp"), np=_float_fn(_lse), kind="reduce", params=_reduce_params),
    *[Op(n, 1, tp=_reduction(n), np=getattr(np, n), kind="reduce",
         params=lambda r, s: _reduce_params(r, s, single=True)) for n in ("argmax", "argmin")],
    Op("softmax", 1, tp=_along(tp.nn.functional.softmax), np=_float_fn(_softmax), kind="reduce",
       params=_axis_param, needs_ndim=1),
    Op("log_softmax", 1, tp=_along(tp.nn.functional.log_softmax), np=_float_fn(_log_softmax), kind="reduce",
       params=_axis_param, needs_ndim=1),
    # linear algebra and shapes (a second operand, when there is one, is made to fit)
    Op("@", 2, **_same(lambda a, b: a @ b), kind="matmul", needs_ndim=1),
    Op("reshape(-1)", 1, **_same(lambda a: a.reshape(-1)), kind="shape"),
    Op(".T", 1, **_same(lambda a: a.T), kind="shape"),
    Op("x[::2]", 1, **_same(lambda a: a[::2]), kind="shape", needs_ndim=1),
    Op("x[..., 1:]", 1, **_same(lambda a: a[..., 1:]), kind="shape", needs_ndim=1),
    Op("flip", 1, tp=lambda a, axis: tp.flip(a, axis), np=lambda a, axis: np.flip(a, axis), kind="shape",
       params=lambda r, s: {"axis": int(r.integers(-len(s), len(s)))}, needs_ndim=1),
    Op("unsqueeze", 1, tp=lambda a, axis: tp.unsqueeze(a, axis), np=lambda a, axis: np.expand_dims(a, axis),
       kind="shape", params=lambda r, s: {"axis": int(r.integers(-len(s) - 1, len(s) + 1))}),
    Op("concat", 2, tp=lambda a, b: tp.concat([a, b], axis=-1),
       np=lambda a, b: np.concatenate([a, b], axis=-1), kind="shape", needs_ndim=1),
    Op("stack", 2, tp=lambda a, b: tp.stack([a, b]), np=lambda a, b: np.stack([a, b]), kind="shape"),
    Op("pad", 1, tp=lambda a: tp.pad(a, 1, 1), np=lambda a: np.pad(a, 1, constant_values=1), kind="shape",
       needs_ndim=1),
    Op("full_like", 1, tp=lambda a: tp.full_like(a, 3), np=lambda a: np.full_like(a, 3), kind="shape"),
    Op("zeros_like", 1, **{"tp": tp.zeros_like, "np": np.zeros_like}, kind="shape"),
]
BY_NAME = {op.name: op for op in OPS}
