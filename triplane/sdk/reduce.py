"""Reductions: ``tp.sum(x, axis=1, keepdims=True)`` and friends.

``axis`` is None (every axis), an int or a sequence of ints; negative axes count from the
end. The recorded node names its axes sorted and non-negative, so ``x.sum(-1)`` and
``x.sum(x.ndim - 1)`` are the same node.

PyTorch's spellings are accepted too: ``dim=`` for ``axis=`` and ``keepdim=`` for
``keepdims=`` (``x.sum(dim=1, keepdim=True)``); giving both spellings raises TypeError.
``x.max(dim=1)`` gives the values only (torch's gives values and indices: see argmax).

Dtypes follow numpy 2: ``sum``/``prod`` of bools and integers count in int64 (numpy's
uint8 sum is uint64, which triplane does not have), of floats in their dtype; ``mean``
and ``var`` of integers or bools give float64; ``logsumexp`` computes integers in the
float ``exp`` would (:func:`triplane.proto.dtypes.float_of`); ``max``/``min`` keep the
dtype; ``argmax``/``argmin`` give int64. Over an empty axis: sum = 0, prod = 1,
mean = nan, logsumexp = -inf; max, min, argmax and argmin raise ShapeError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto.errors import GraphError
from triplane.proto.opdef import normalise_axes, normalise_axis
from triplane.sdk.elementwise import as_float, cast
from triplane.sdk.tensor import UNSET as _UNSET
from triplane.sdk.tensor import Tensor, apply, as_tensor, spelling

__all__ = ["argmax", "argmin", "logsumexp", "max", "mean", "min", "prod", "sum", "var"]

Axis = int | Sequence[int] | None


def _args(op: str, axis: Any, keepdims: Any, dim: Any, keepdim: Any) -> tuple[Any, bool]:
    return (spelling(op, "axis", axis, "dim", dim, None),
            spelling(op, "keepdims", keepdims, "keepdim", keepdim, False))


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


def _as_mean(x: Any) -> Tensor:
    x = as_tensor(x)
    return cast(x, dt.true_divide_type(x.dtype))


def _as_countable(x: Any) -> Tensor:
    x = as_tensor(x)
    return cast(x, dt.sum_type(x.dtype))


def sum(x: Any, axis: Axis = _UNSET, keepdims: bool = _UNSET, *, dim: Axis = _UNSET,
        keepdim: bool = _UNSET) -> Tensor:
    """Sum over ``axis`` (every axis when None); bools and integers count in int64."""
    return _reduce("sum", _as_countable(x), *_args("sum", axis, keepdims, dim, keepdim))


def prod(x: Any, axis: Axis = _UNSET, keepdims: bool = _UNSET, *, dim: Axis = _UNSET,
         keepdim: bool = _UNSET) -> Tensor:
    """Product over ``axis`` (bools and integers in int64); the gradient is exact with
    zeros present."""
    return _reduce("prod", _as_countable(x), *_args("prod", axis, keepdims, dim, keepdim))


def max(x: Any, axis: Axis = _UNSET, keepdims: bool = _UNSET, *, dim: Axis = _UNSET,
        keepdim: bool = _UNSET) -> Tensor:
    """Maximum over ``axis``; tied maxima share the gradient equally."""
    return _reduce("max", x, *_args("max", axis, keepdims, dim, keepdim))


def min(x: Any, axis: Axis = _UNSET, keepdims: bool = _UNSET, *, dim: Axis = _UNSET,
        keepdim: bool = _UNSET) -> Tensor:
    """Minimum over ``axis``; tied minima share the gradient equally."""
    return _reduce("min", x, *_args("min", axis, keepdims, dim, keepdim))


def mean(x: Any, axis: Axis = _UNSET, keepdims: bool = _UNSET, *, dim: Axis = _UNSET,
         keepdim: bool = _UNSET) -> Tensor:
    """Arithmetic mean over ``axis`` (nan over an empty axis, as numpy); integers and
    bools give float64."""
    return _reduce("mean", _as_mean(x), *_args("mean", axis, keepdims, dim, keepdim))


def var(x: Any, axis: Axis = _UNSET, keepdims: bool = _UNSET, ddof: int = 0, *, dim: Axis = _UNSET,
        keepdim: bool = _UNSET) -> Tensor:
    """Variance ``sum((x - mean)**2) / (N - ddof)`` (integers and bools give float64);
    ShapeError when ``N - ddof <= 0``."""
    return _reduce("var", _as_mean(x), *_args("var", axis, keepdims, dim, keepdim), ddof=ddof)


def logsumexp(x: Any, axis: Axis = _UNSET, keepdims: bool = _UNSET, *, dim: Axis = _UNSET,
              keepdim: bool = _UNSET) -> Tensor:
    """``log(sum(exp(x)))`` over ``axis``, without overflow for large ``x``."""
    return _reduce("logsumexp", as_float(x), *_args("logsumexp", axis, keepdims, dim, keepdim))


def _arg(op: str, x: Any, axis: int | None, keepdims: bool) -> Tensor:
    x = as_tensor(x)
    if axis is not None:
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise TypeError(f"{op}: axis must be an int or None, got {axis!r}")
        if x.ndim and -x.ndim <= axis < x.ndim:
            axis = normalise_axis(axis, x.ndim)
    return apply(op, [x], axis=axis, keepdims=keepdims)


def argmax(x: Any, axis: int | None = _UNSET, keepdims: bool = _UNSET, *, dim: int | None = _UNSET,
           keepdim: bool = _UNSET) -> Tensor:
    """int64 index of the (first) maximum along ``axis``, or in the flattened tensor."""
    return _arg("argmax", x, *_args("argmax", axis, keepdims, dim, keepdim))


def argmin(x: Any, axis: int | None = _UNSET, keepdims: bool = _UNSET, *, dim: int | None = _UNSET,
           keepdim: bool = _UNSET) -> Tensor:
    """int64 index of the (first) minimum along ``axis``, or in the flattened tensor."""
    return _arg("argmin", x, *_args("argmin", axis, keepdims, dim, keepdim))

