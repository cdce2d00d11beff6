"""Creation functions: ``tp.tensor``, ``tp.zeros``, ``tp.arange``, ``tp.randn``, ...

Shapes are an int or a sequence of ints; ``zeros``, ``ones``, ``rand`` and ``randn`` also
take them as separate ints, as PyTorch's do (``tp.zeros(3, 3)``, ``tp.ones(2, 3,
dtype="int8")``), and ``zeros``/``ones`` numpy's positional dtype (``tp.zeros((2, 3),
"int8")``). Floats default to float32 (PyTorch's default, not numpy's float64).

Everything but :func:`tensor` records a source node (no host data travels); random
tensors are counter-based (element i is a function of the seed and i alone), so they are
the same on every engine and for every tiling.

Seeds: a random function called with ``seed=None`` takes the next seed of a process-wide
stream; :func:`manual_seed` restarts that stream, so a program that calls it first makes
the same tensors every run (the stream starts as if ``manual_seed(0)`` had been called).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import AttrError, DTypeError
from triplane.proto.ir import encode_data, fits_json
from triplane.sdk.tensor import Tensor, apply, as_tensor

__all__ = [
    "arange", "eye", "full", "full_like", "manual_seed", "normal", "ones", "ones_like", "rand",
    "randn", "tensor", "uniform", "zeros", "zeros_like",
]

Shape = int | Sequence[int]


def _shape(shape: Shape) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        return (shape,)
    try:
        out = tuple(shape)  # type: ignore[arg-type]
    except TypeError:
        raise AttrError(f"a shape is an int or a sequence of ints, got {shape!r}") from None
    return out


def _dtype_of_value(value: Any) -> dt.DType:
    if isinstance(value, (bool, int, float)):
        return dt.scalar_dtype(value)
    raise DTypeError(f"fill value {value!r} is not a number or a boolean")


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor holding a copy of ``data`` (array-like). Python floats default to float32,
    ints to int64; a numpy array keeps its dtype unless ``dtype`` is given."""
    return Tensor.from_array(data, dtype, requires_grad)


def full(shape: Shape, value: bool | int | float, dtype: Any = None) -> Tensor:
    """Every element ``value``; ``dtype`` defaults to that of the value (bool, int64 or
    float32)."""
    d = dt.dtype(dtype) if dtype is not None else _dtype_of_value(value)
    shape = _shape(shape)
    if isinstance(value, float) and not fits_json(value):
        # nan, inf and -0.0 do not survive JSON: a 0-d inline constant, broadcast
        c = apply("constant", [], data=encode_data(np.array(value, d.np)), shape=(), dtype=d.name)
        return c if not shape else apply("broadcast_to", [c], shape=shape)
    return apply("full", [], value=value, shape=shape, dtype=d.name)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shape_args(op: str, args: tuple[Any, ...], dtype: Any = None) -> tuple[tuple[int, ...], Any]:
    """The shape and dtype of ``op(*args, dtype=dtype)``: separate ints (``zeros(2, 3)``) or
    one int or sequence (``zeros((2, 3))``), then optionally a dtype (numpy's
    ``zeros((2, 3), "int8")``)."""
    n = 0
    while n < len(args) and _is_int(args[n]):
        n += 1
    if n:
        shape: tuple[int, ...] = tuple(args[:n])
    elif args:
        shape, n = _shape(args[0]), 1
    else:
        raise TypeError(f"{op}() needs a shape: {op}(2, 3) or {op}((2, 3))")
    rest = args[n:]
    if len(rest) > 1 or (rest and dtype is not None):
        raise TypeError(f"{op}() takes a shape (ints, or one sequence) and one dtype; got "
                        f"{', '.join(map(repr, args))}{f' and dtype={dtype!r}' if dtype is not None else ''}")
    return shape, rest[0] if rest else dtype


def zeros(*shape: Any, dtype: Any = None) -> Tensor:
    """A tensor of zeros: ``zeros(2, 3)``, ``zeros((2, 3))``, ``zeros(2, 3, dtype="int8")``;
    float32 unless ``dtype`` says otherwise."""
    s, d = shape_args("zeros", shape, dtype)
    return full(s, 0, d if d is not None else dt.DEFAULT_FLOAT)


def ones(*shape: Any, dtype: Any = None) -> Tensor:
    """A tensor of ones, with the shape and dtype conventions of :func:`zeros`."""
    s, d = shape_args("ones", shape, dtype)
    return full(s, 1, d if d is not None else dt.DEFAULT_FLOAT)


def full_like(x: Any, value: bool | int | float, dtype: Any = None) -> Tensor:
    """Like :func:`full`, with x's shape and (by default) x's dtype."""
    x = as_tensor(x)
    return full(x.shape, value, x.dtype if dtype is None else dtype)


def zeros_like(x: Any, dtype: Any = None) -> Tensor:
    return full_like(x, 0, dtype)


def ones_like(x: Any, dtype: Any = None) -> Tensor:
    return full_like(x, 1, dtype)


def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = None) -> Tensor:
    """numpy.arange: ``arange(n)`` is 0..n-1, ``arange(a, b, s)`` steps from a towards b
    (b excluded). ``dtype`` defaults to int64 when all three are ints, else float32."""
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop, step))
        dtype = dt.DEFAULT_INT if ints else dt.DEFAULT_FLOAT
    return apply("arange", [], start=start, stop=stop, step=step, dtype=dt.dtype(dtype).name)


def eye(n: int, m: int | None = None, k: int = 0, dtype: Any = "float32") -> Tensor:
    """numpy.eye: an n x m matrix (m defaults to n) with ones on diagonal k."""
    return apply("eye", [], n=n, m=m, k=k, dtype=dt.dtype(dtype).name)


# --- random -------------------------------------------------------------------------------

_SEED_MASK = (1 << 53) - 1  # seeds travel as JSON numbers (exact below 2**53 everywhere)
_lock = threading.Lock()
_stream = {"base": 0, "count": 0}


def manual_seed(seed: int) -> None:
    """Restart the seed stream used by random functions called without a seed."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise AttrError(f"manual_seed needs an integer, got {seed!r}")
    with _lock:
        _stream["base"], _stream["count"] = seed, 0


def _splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def next_seed() -> int:
    """The next seed of the stream ``manual_seed`` restarts (for random ops, dropout and
    parameter initialisation called without an explicit seed); below 2**53."""
    with _lock:
        base, count = _stream["base"], _stream["count"]
        _stream["count"] = count + 1
    # Hashing (base, count) keeps the streams of nearby manual seeds apart.
    return _splitmix(_splitmix(base & 0xFFFFFFFFFFFFFFFF) ^ count) & _SEED_MASK


def _seed(seed: int | None) -> int:
    return next_seed() if seed is None else seed


def uniform(shape: Shape, low: float = 0.0, high: float = 1.0, seed: int | None = None,
            dtype: Any = "float32") -> Tensor:
    """Uniform numbers in [low, high) (rounding to a narrow dtype may reach ``high``)."""
    return apply("uniform", [], shape=_shape(shape), low=low, high=high, seed=_seed(seed),
                 dtype=dt.dtype(dtype).name)


def normal(shape: Shape, mean: float = 0.0, std: float = 1.0, seed: int | None = None,
           dtype: Any = "float32") -> Tensor:
    """Normally distributed numbers with the given mean and standard deviation."""
    return apply("normal", [], shape=_shape(shape), mean=mean, std=std, seed=_seed(seed),
                 dtype=dt.dtype(dtype).name)


def _varargs_shape(op: str, shape: tuple[Any, ...]) -> tuple[int, ...]:
    s, extra = shape_args(op, shape)
    if extra is not None:
        raise TypeError(f"{op}() takes a shape (ints, or one sequence); pass dtype= by name")
    return s


def rand(*shape: Any, seed: int | None = None, dtype: Any = "float32") -> Tensor:
    """Uniform in [0, 1): ``rand(2, 3)`` or ``rand((2, 3))``; float32 by default."""
    return uniform(_varargs_shape("rand", shape), seed=seed, dtype=dtype)


def randn(*shape: Any, seed: int | None = None, dtype: Any = "float32") -> Tensor:
    """Standard normal: ``randn(2, 3)`` or ``randn((2, 3))``; float32 by default."""
    return normal(_varargs_shape("randn", shape), seed=seed, dtype=dtype)
