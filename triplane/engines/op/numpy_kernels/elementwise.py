"""Kernels of the elementwise ops.

Kernels get numpy arrays (bfloat16 already widened to float32 by the engine) and may
return any dtype: the engine rounds the result to the inferred one. Functions composed of
several steps (sigmoid, silu, gelu, erf) are computed in float64 for the narrower float
dtypes, so the only error left is the final rounding.
"""

from __future__ import annotations

import math

import numpy as np

from triplane.engines.op.numpy_kernels.table import KernelGroup

KERNEL_GROUP = KernelGroup()  # registered by numpy_kernels.register_all
kernel = KERNEL_GROUP.kernel

_UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "square": np.square, "sign": np.sign,
    "logical_not": np.logical_not, "abs": np.abs, "reciprocal": np.reciprocal,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
}

for _name, _fn in _UNARY.items():
    kernel(_name)(lambda ins, a, out, _fn=_fn: _fn(ins[0]))
for _name, _fn in _BINARY.items():
    kernel(_name)(lambda ins, a, out, _fn=_fn: _fn(ins[0], ins[1]))


def _wide(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.float64 else x.astype(np.float64)


@kernel("relu")
def _relu(ins, a, out):
    x = ins[0]
    return np.maximum(x, np.zeros((), dtype=x.dtype))  # nan stays nan


@kernel("floor")
def _floor(ins, a, out):
    x = ins[0]
    return x if x.dtype.kind != "f" else np.floor(x)


@kernel("ceil")
def _ceil(ins, a, out):
    x = ins[0]
    return x if x.dtype.kind != "f" else np.ceil(x)


@kernel("rsqrt")
def _rsqrt(ins, a, out):
    return np.reciprocal(np.sqrt(ins[0]))


@kernel("div")
def _div(ins, a, out):
    return np.true_divide(ins[0], ins[1])


def _int_divisor(y, op: str) -> None:
    # numpy gives 0 (with a warning) for an integer divided by zero; the IR makes it a
    # user error, so that no engine returns a made-up number.
    if np.any(y == 0):
        raise ZeroDivisionError(f"integer {op} by zero")


@kernel("floor_divide")
def _floor_divide(ins, a, out):
    x, y = ins
    if out.dtype.is_int and out.size:
        _int_divisor(y, "division")
    return np.floor_divide(x, y)


@kernel("remainder")
def _remainder(ins, a, out):
    x, y = ins
    if out.dtype.is_int and out.size:
        _int_divisor(y, "remainder")
    return np.remainder(x, y)


@kernel("pow")
def _pow(ins, a, out):
    x, y = ins
    if out.dtype.is_int and out.size and np.any(y < 0):  # (no element computed: no error, as numpy)
        bad = y[y < 0].reshape(-1)[0]
        raise ValueError(f"integer pow with a negative exponent ({bad}); cast to a float dtype first")
    return np.power(x, y)


@kernel("where")
def _where(ins, a, out):
    return np.where(ins[0], ins[1], ins[2])


@kernel("cast")
def _cast(ins, a, out):
    return ins[0].astype(out.dtype.np)


# --- sigmoid family ---------------------------------------------------------------------


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow: exp is only taken of -|x|."""
    x = _wide(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@kernel("sigmoid")
def _sigmoid(ins, a, out):
    return sigmoid(ins[0])


@kernel("silu")
def _silu(ins, a, out):
    x = _wide(ins[0])
    return x * sigmoid(x)


# --- the error function -----------------------------------------------------------------
#
# numpy has no erf, and scipy is not a runtime dependency. For |x| < 2.5 the series
#     erf(x) = 2/sqrt(pi) exp(-x^2) sum_n (2 x^2)^n x / (1 * 3 * ... * (2n + 1))
# has positive terms only (no cancellation; at most ~40 of them), and for |x| >= 2.5 the
# continued fraction
#     erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))
# converges to double precision within 50 levels. exp(-x^2) is taken as
# exp(-h^2) exp(-(x - h)(x + h)) with h = x rounded down to 1/16, whose square is exact, so
# that erfc stays accurate to ~1e-15 relative far into the tail (erfc(26) ~ 1e-296).

_SERIES_LIMIT = 2.5
_CF_DEPTH = 50
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def _exp_minus_square(a: np.ndarray) -> np.ndarray:
    h = np.floor(a * 16.0) / 16.0
    return np.exp(-h * h) * np.exp(-(a - h) * (a + h))


def _erf_series(a: np.ndarray) -> np.ndarray:
    """erf(a) for 0 <= a < 2.5."""
    term = a.copy()
    total = a.copy()
    a2 = 2.0 * a * a
    for n in range(1, 200):
        term *= a2 / (2 * n + 1)
        total += term
        if not np.any(term > 1e-17 * total):
            break
    return _TWO_OVER_SQRT_PI * _exp_minus_square(a) * total


def _erfc_cf(a: np.ndarray) -> np.ndarray:
    """erfc(a) for a >= 2.5 (inf gives 0)."""
    f = a.copy()
    for k in range(_CF_DEPTH, 0, -1):
        f = a + (0.5 * k) / f
    return np.where(np.isinf(a), 0.0, _INV_SQRT_PI * _exp_minus_square(a) / f)


def erf_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(erf(|x|), erfc(|x|)) in float64, each accurate to ~1e-15 relative
    (erfc only to ~1e-15 absolute for |x| < 2.5, where it is > 4e-4)."""
    a = np.abs(_wide(x))
    near = a < _SERIES_LIMIT
    erf = np.empty_like(a)
    erfc = np.empty_like(a)
    with np.errstate(invalid="ignore"):  # inf - inf inside exp(-x^2) at x = inf: masked
        if np.any(near):
            e = _erf_series(a[near])
            erf[near], erfc[near] = e, 1.0 - e
        far = ~near
        if np.any(far):
            c = _erfc_cf(a[far])
            erf[far], erfc[far] = 1.0 - c, c
    return erf, erfc


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in float64 (nan stays nan)."""
    x = _wide(np.asarray(x))
    e, _ = erf_parts(x)
    return np.where(np.isnan(x), x, np.copysign(e, x))


@kernel("erf")
def _erf(ins, a, out):
    return erf(ins[0])


@kernel("gelu")
def _gelu(ins, a, out):
    # x * Phi(x), with Phi(x) = erfc(-x / sqrt2) / 2 taken from erfc for x < 0 so that
    # the far negative tail keeps its relative accuracy (1 + erf(x) would cancel).
    x = _wide(ins[0])
    e, c = erf_parts(x / math.sqrt(2.0))
    phi = np.where(x >= 0, 1.0 + e, c) * 0.5
    return np.where(np.isnan(x), x, x * phi)
