"""Reductions: ``tp.sum(x, axis=1, keepdims=True)`` and friends.

``axis`` is None (every axis), an int or a sequence of ints; negative axes count from the
end. The recorded node names its axes sorted and non-negative, so ``x.sum(-1)`` and
``x.sum(x.ndim - 1)`` are the same node.

Dtypes follow numpy except where noted: ``sum``/``prod`` of bools count in int64;
``mean``, ``var`` and ``logsumexp`` of integers or bools compute in float32 (numpy gives
float64; float32 is triplane's default float). Over an empty axis: sum = 0, prod = 1,
mean = nan, logsumexp = -inf; max, min, argmax and argmin raise ShapeError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto.errors import GraphError
from triplane.proto.opdef import normalise_axes, normalise_axis
from triplane.sdk.elementwise import cast
from triplane.sdk.tensor import Tensor, apply, as_tensor

__all__ = ["argmax", "argmin", "logsumexp", "max", "mean", "min", "prod", "sum", "var"]

Axis = int | Sequence[int] | None


def _axes(x: Tensor, axis: Axis) -> list[int] | None:
    if axis is None:
        return None
    given = (axis,) if isinstance(axis, int) else tuple(axis)
    return list(normalise_axes(given, x.ndim))


def _reduce(op: str, x: Any, axis: Axis, keepdims: bool, **attrs: Any) -> Tensor:
    x = as_tensor(x)
    try:
        axes = _axes(x, axis)
    except (GraphError, TypeError):
        # Let the op's own inference raise: its error names the op, shape and user's line.
        axes = axis
    return apply(op, [x], axes=axes, keepdims=keepdims, **attrs)


def _as_float(x: Any) -> Tensor:
    x = as_tensor(x)
    return x if x.dtype.is_float else cast(x, dt.DEFAULT_FLOAT)


def _as_countable(x: Any) -> Tensor:
    x = as_tensor(x)
    return cast(x, dt.int64) if x.dtype.kind == "bool" else x


def sum(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Sum over ``axis`` (every axis when None); bools count as int64."""
    return _reduce("sum", _as_countable(x), axis, keepdims)


def prod(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Product over ``axis``; the gradient is exact with zeros present."""
    return _reduce("prod", _as_countable(x), axis, keepdims)


def max(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis``; tied maxima share the gradient equally."""
    return _reduce("max", x, axis, keepdims)


def min(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis``; tied minima share the gradient equally."""
    return _reduce("min", x, axis, keepdims)


def mean(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over ``axis`` (nan over an empty axis, as numpy)."""
    return _reduce("mean", _as_float(x), axis, keepdims)


def var(x: Any, axis: Axis = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance ``sum((x - mean)**2) / (N - ddof)``; ShapeError when ``N - ddof <= 0``."""
    return _reduce("var", _as_float(x), axis, keepdims, ddof=ddof)


def logsumexp(x: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` over ``axis``, without overflow for large ``x``."""
    return _reduce("logsumexp", _as_float(x), axis, keepdims)


def _arg(op: str, x: Any, axis: int | None, keepdims: bool) -> Tensor:
    x = as_tensor(x)
    if axis is not None:
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise TypeError(f"{op}: axis must be an int or None, got {axis!r}")
        if x.ndim and -x.ndim <= axis < x.ndim:
            axis = normalise_axis(axis, x.ndim)
    return apply(op, [x], axis=axis, keepdims=keepdims)


def argmax(x: Any, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the (first) maximum along ``axis``, or in the flattened tensor."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x: Any, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the (first) minimum along ``axis``, or in the flattened tensor."""
    return _arg("argmin", x, axis, keepdims)

