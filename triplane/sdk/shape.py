"""Shape functions: reshape, transpose, squeeze, concat, split, pad, flip, indexing.

These record explicit IR: reshape without -1, slices with in-range non-negative
start/stop and positive steps (a negative step is a slice followed by ``flip``), integer
indices as a size-1 slice plus a reshape, ``None`` as a reshape. Out-of-range axes and
indices raise at the line that wrote them (a :class:`TensorIndexError`, which is both a
ShapeError and an IndexError, so ``for row in t`` stops at the end as for a list).

PyTorch's spellings are accepted beside numpy's: ``dim=`` for ``axis=`` (squeeze,
unsqueeze, concat, stack, split) and ``dims=`` for flip's ``axis=``; both at once is a
TypeError.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from triplane.proto.errors import DTypeError, ShapeError
from triplane.sdk.elementwise import operands
from triplane.sdk.tensor import UNSET, Tensor, apply, as_tensor, spelling

__all__ = [
    "TensorIndexError", "broadcast_to", "concat", "concatenate", "expand_dims", "flip", "gather",
    "getitem", "index_select", "pad", "permute", "reshape", "slice", "split", "squeeze", "stack",
    "transpose", "unsqueeze",
]


class TensorIndexError(ShapeError, IndexError):
    """An index out of range, or an index form triplane does not support."""


def _axis(x: Tensor, axis: int, op: str, ndim: int | None = None) -> int:
    nd = x.ndim if ndim is None else ndim
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -nd <= axis < nd:
        raise ShapeError(f"axis {axis} is out of range for shape {x.shape}", op=op)
    return int(axis) % nd


def _axes(x: Tensor, axis: int | Sequence[int] | None, op: str, ndim: int | None = None) -> list[int] | None:
    if axis is None:
        return None
    given = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = [_axis(x, a, op, ndim) for a in given]
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {given} for shape {x.shape}", op=op)
    return sorted(out)


# --- reshape, transpose, broadcast_to, squeeze, unsqueeze ---------------------------------------


def reshape(x: Any, shape: Sequence[int] | int) -> Tensor:
    """numpy.reshape; one dimension may be -1 (inferred)."""
    x = as_tensor(x)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise ShapeError(f"cannot reshape {x.shape} to {list(shape)}: only one dimension may be -1 "
                         "and none may be below it", op="reshape")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or x.size % rest:
            raise ShapeError(f"cannot reshape {x.shape} ({x.size} elements) to {list(shape)}",
                             op="reshape")
        shape = tuple(x.size // rest if s == -1 else s for s in shape)
    if shape == x.shape:
        return x
    return apply("reshape", [x], shape=shape)


def transpose(x: Any, axes: Sequence[int] | None = None) -> Tensor:
    """numpy.transpose: reverse the axes, or permute them as ``axes`` says (negative
    axes count from the end)."""
    x = as_tensor(x)
    if axes is None:
        perm = tuple(range(x.ndim))[::-1]
    else:
        axes = tuple(axes)
        ok = len(axes) == x.ndim and all(isinstance(a, (int, np.integer)) and -x.ndim <= a < x.ndim
                                         for a in axes)
        # An invalid perm goes to the op unchanged, whose inference names it and the shape.
        perm = tuple(int(a) % x.ndim for a in axes) if ok else axes
    if perm == tuple(range(x.ndim)):
        return x
    return apply("transpose", [x], perm=perm)


def permute(x: Any, *axes: int) -> Tensor:
    """torch's spelling of :func:`transpose` with the axes as arguments."""
    return transpose(x, axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes)


def broadcast_to(x: Any, shape: Sequence[int]) -> Tensor:
    x = as_tensor(x)
    return x if tuple(shape) == x.shape else apply("broadcast_to", [x], shape=tuple(shape))


def squeeze(x: Any, axis: int | Sequence[int] | None = UNSET, *, dim: int | Sequence[int] | None = UNSET
            ) -> Tensor:
    """Remove axes of size 1 (every such axis when ``axis`` is None); ShapeError if a
    named axis is not of size 1."""
    x = as_tensor(x)
    axis = spelling("squeeze", "axis", axis, "dim", dim, None)
    axes = _axes(x, axis, "squeeze") if x.ndim else None
    if axes == [] or (axes is None and 1 not in x.shape):
        return x
    return apply("squeeze", [x], axes=axes)


def unsqueeze(x: Any, axis: int | Sequence[int] = UNSET, *, dim: int | Sequence[int] = UNSET) -> Tensor:
    """Insert axes of size 1; ``axis`` are positions in the result (negative from its end)."""
    x = as_tensor(x)
    axis = spelling("unsqueeze", "axis", axis, "dim", dim, UNSET)
    if axis is UNSET:
        raise TypeError("unsqueeze() needs the position of the new axis: axis= (or dim=)")
    n = 1 if isinstance(axis, (int, np.integer)) else len(list(axis))
    return apply("unsqueeze", [x], axes=_axes(x, axis, "unsqueeze", x.ndim + n))


expand_dims = unsqueeze


# --- concat, stack, split -----------------------------------------------------------------------


def _many(tensors: Sequence[Any], op: str) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence) or not tensors:
        raise TypeError(f"{op} takes a non-empty list of tensors")
    return operands(*tensors)


def concat(tensors: Sequence[Any], axis: int = UNSET, *, dim: int = UNSET) -> Tensor:
    """Join tensors along an existing axis (default 0; dtypes promoted as for arithmetic)."""
    axis = spelling("concat", "axis", axis, "dim", dim, 0)
    ts = _many(tensors, "concat")
    if ts[0].ndim and -ts[0].ndim <= axis < ts[0].ndim:
        axis %= ts[0].ndim
    return ts[0] if len(ts) == 1 else apply("concat", ts, axis=axis)


concatenate = concat


def stack(tensors: Sequence[Any], axis: int = UNSET, *, dim: int = UNSET) -> Tensor:
    """Join tensors of one shape along a new axis at position ``axis`` of the result
    (default 0; dtypes promoted as for arithmetic)."""
    axis = spelling("stack", "axis", axis, "dim", dim, 0)
    ts = _many(tensors, "stack")
    nd = ts[0].ndim + 1
    if -nd <= axis < nd:
        axis %= nd
    return apply("stack", ts, axis=axis)


def split(x: Any, sections_or_sizes: int | Sequence[int], axis: int = UNSET, *, dim: int = UNSET
          ) -> list[Tensor]:
    """Cut ``x`` along ``axis`` (default 0): an int ``n`` gives n equal pieces (the
    dimension must divide evenly, as numpy.split); a list gives pieces of those sizes
    (summing to the dimension, as torch.split). Each piece is a ``slice`` node."""
    axis = spelling("split", "axis", axis, "dim", dim, 0)
    x = as_tensor(x)
    ax = _axis(x, axis, "split")
    length = x.shape[ax]
    if isinstance(sections_or_sizes, (int, np.integer)):
        n = int(sections_or_sizes)
        if n <= 0 or length % n:
            raise ShapeError(f"cannot split axis {ax} of shape {x.shape} into {n} equal pieces",
                             op="split")
        sizes = [length // n] * n
    else:
        sizes = [int(s) for s in sections_or_sizes]
        if any(s < 0 for s in sizes) or builtins.sum(sizes) != length:
            raise ShapeError(f"sizes {sizes} do not add up to {length}, axis {ax} of shape {x.shape}",
                             op="split")
    pieces, start = [], 0
    for s in sizes:
        pieces.append(_slice_nodes(x, [(builtins.slice(start, start + s, 1), ax)]))
        start += s
    return pieces


# --- slicing and indexing -----------------------------------------------------------------------


def _slice_nodes(x: Tensor, slices: list[tuple[builtins.slice, int]]) -> Tensor:
    """One ``slice`` node (and a ``flip`` for negative steps) applying python slices to axes."""
    starts, stops, steps = [0] * x.ndim, list(x.shape), [1] * x.ndim
    flips = []
    for sl, ax in slices:
        start, stop, step = sl.indices(x.shape[ax])
        n = len(range(start, stop, step))
        if n == 0:  # canonical empty slice
            starts[ax], stops[ax], steps[ax] = 0, 0, 1
            continue
        if step < 0:  # the same elements, taken forwards, then reversed
            flips.append(ax)
            start, step = start + (n - 1) * step, -step
        # Canonical form: stop just past the last element taken.
        starts[ax], stops[ax], steps[ax] = start, start + (n - 1) * step + 1, step
    if starts != [0] * x.ndim or stops != list(x.shape) or steps != [1] * x.ndim:
        x = apply("slice", [x], starts=starts, stops=stops, steps=steps)
    flips = [ax for ax in flips if x.shape[ax] > 1]
    return apply("flip", [x], axes=sorted(flips)) if flips else x


def slice(x: Any, starts: Sequence[int], stops: Sequence[int], steps: Sequence[int] | None = None,
          axes: Sequence[int] | None = None) -> Tensor:
    """ONNX-style slicing: ``x[starts[i]:stops[i]:steps[i]]`` on ``axes[i]`` (default: the
    first ``len(starts)`` axes), with Python's clamping and negative values."""
    x = as_tensor(x)
    steps = [1] * len(starts) if steps is None else list(steps)
    axes = list(range(len(starts))) if axes is None else list(axes)
    if not len(starts) == len(stops) == len(steps) == len(axes):
        raise ShapeError(f"starts {list(starts)}, stops {list(stops)}, steps {steps} and axes {axes} "
                         "differ in length", op="slice")
    if any(s == 0 for s in steps):
        raise ShapeError("slice step cannot be zero", op="slice")
    norm = [_axis(x, a, "slice") for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"repeated axis in {axes} for shape {x.shape}", op="slice")
    return _slice_nodes(x, [(builtins.slice(a, b, c), ax)
                            for a, b, c, ax in zip(starts, stops, steps, norm)])


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def getitem(x: Any, index: Any) -> Tensor:
    """``x[index]`` with numpy's basic indexing plus one integer-array index.

    Supported: ints (negative from the end), slices with any step, ``...``, ``None``
    (a new axis of size 1), and one integer index array (a Tensor, numpy array or list of
    ints, any shape) on one axis, which becomes a ``gather``. Boolean masks and several
    index arrays are not supported (TensorIndexError). When an integer and an index
    array are separated by a slice, the array's axes come first, as numpy does.
    """
    x = as_tensor(x)
    items = list(index) if isinstance(index, tuple) else [index]
    consumed = [it for it in items if it is not None and it is not Ellipsis]
    if builtins.sum(1 for it in items if it is Ellipsis) > 1:
        raise TensorIndexError(f"an index can only have one ellipsis, got {index!r}")
    if len(consumed) > x.ndim:
        raise TensorIndexError(f"too many indices ({len(consumed)}) for shape {x.shape}")
    at = next((i for i, it in enumerate(items) if it is Ellipsis), None)
    if at is not None:
        items[at:at + 1] = [builtins.slice(None)] * (x.ndim - len(consumed))
    else:
        items += [builtins.slice(None)] * (x.ndim - len(consumed))

    slices: list[tuple[builtins.slice, int]] = []
    gather_at: tuple[int, Tensor] | None = None
    out_dims: list[tuple[str, Any]] = []  # ("dim", size) | ("new", 1) | ("arr", shape)
    adv_positions: list[int] = []  # index-item positions of ints and the array (numpy's rule)
    ax = 0
    for pos, it in enumerate(items):
        if it is None:
            out_dims.append(("new", 1))
            continue
        dim = x.shape[ax]
        if _is_int(it):
            i = int(it)
            if not -dim <= i < dim:
                raise TensorIndexError(f"index {i} is out of range for axis {ax} of size {dim} "
                                       f"(shape {x.shape})")
            i %= dim
            slices.append((builtins.slice(i, i + 1, 1), ax))
            adv_positions.append(pos)
        elif isinstance(it, builtins.slice):
            slices.append((it, ax))
            out_dims.append(("dim", len(range(*it.indices(dim)))))
        elif isinstance(it, (Tensor, np.ndarray, list)):
            if gather_at is not None:
                raise TensorIndexError("only one integer-array index is supported")
            idx = _index_array(it, dim, ax, x.shape)
            gather_at = (ax, idx)
            out_dims.append(("arr", idx.shape))
            adv_positions.append(pos)
        else:
            raise TensorIndexError(f"unsupported index {it!r} (ints, slices, ..., None and one "
                                   "integer array are supported)")
        ax += 1

    y = _slice_nodes(x, slices)
    if gather_at is not None:
        y = apply("gather", [y, gather_at[1]], axis=gather_at[0])
    shape: list[int] = []
    arr_at = arr_len = 0
    for kind, v in out_dims:
        if kind == "arr":
            arr_at, arr_len = len(shape), len(v)
            shape.extend(v)
        else:
            shape.append(v)
    y = reshape(y, tuple(shape))
    contiguous = not adv_positions or adv_positions == list(range(adv_positions[0], adv_positions[-1] + 1))
    if gather_at is not None and not contiguous and arr_at:
        perm = [*range(arr_at, arr_at + arr_len), *range(arr_at), *range(arr_at + arr_len, len(shape))]
        y = transpose(y, perm)
    return y


def _index_array(it: Any, dim: int, ax: int, shape: tuple[int, ...]) -> Tensor:
    if isinstance(it, Tensor):
        if not it.dtype.is_int:
            raise TensorIndexError(f"index tensor has dtype {it.dtype.name}; integer indices are "
                                   "needed (boolean masks are not supported)")
        return it
    arr = np.asarray(it)
    if arr.dtype.kind == "b":
        raise TensorIndexError("boolean mask indices are not supported (the result's shape "
                               "would depend on the data)")
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TensorIndexError(f"index array has dtype {arr.dtype}; integer indices are needed")
    if arr.size and (arr.min() < -dim or arr.max() >= dim):
        raise TensorIndexError(f"index {int(arr[(arr < -dim) | (arr >= dim)].flat[0])} is out of "
                               f"range for axis {ax} of size {dim} (shape {shape})")
    return Tensor.from_array(arr.astype(np.int64))


def gather(x: Any, index: Any, axis: int = 0) -> Tensor:
    """numpy.take(x, index, axis): the result has ``index``'s dims in place of ``axis``.
    Indices lie in [-dim, dim); out of range is a KernelError when the graph runs."""
    x = as_tensor(x)
    idx = index if isinstance(index, Tensor) else Tensor.from_array(np.asarray(index))
    if not idx.dtype.is_int:
        raise DTypeError(f"indices must be integers, got {idx.dtype.name} of shape {idx.shape} "
                         f"(to gather from {x.shape})", op="gather")
    if x.ndim and -x.ndim <= axis < x.ndim:
        axis %= x.ndim
    return apply("gather", [x, idx], axis=axis)


def index_select(x: Any, axis: int, index: Any) -> Tensor:
    """torch.index_select: the entries of ``x`` at a 1-d ``index`` along ``axis``."""
    idx = index if isinstance(index, Tensor) else Tensor.from_array(np.asarray(index))
    if idx.ndim != 1:
        raise ShapeError(f"index must be 1-d, got shape {idx.shape}", op="index_select")
    return gather(x, idx, axis)


# --- pad, flip ----------------------------------------------------------------------------------


def pad(x: Any, pad_width: int | Sequence[int] | Sequence[Sequence[int]], value: float | int | bool = 0
        ) -> Tensor:
    """numpy.pad with a constant: ``pad_width`` is an int (every side), a pair
    ``(before, after)`` (every axis) or one pair per axis."""
    x = as_tensor(x)
    pw = np.asarray(pad_width)
    if pw.dtype.kind not in "iu" or pw.ndim > 2 or (pw.size and pw.min() < 0):
        raise ShapeError(f"pad_width {pad_width!r} must be non-negative ints: n, (before, after) or "
                         f"one pair per axis of {x.shape}", op="pad")
    try:
        pairs = np.broadcast_to(pw.reshape(-1, 2) if pw.ndim == 2 else pw, (x.ndim, 2))
    except ValueError:
        raise ShapeError(f"pad_width {pad_width!r} does not fit shape {x.shape}", op="pad") from None
    pads = [[int(a), int(b)] for a, b in pairs]
    if not any(a or b for a, b in pads):
        return x
    return apply("pad", [x], pads=pads, value=value)


def flip(x: Any, axis: int | Sequence[int] | None = UNSET, *, dims: int | Sequence[int] = UNSET) -> Tensor:
    """Reverse the order of elements along ``axis`` (every axis when None; torch's
    ``dims=`` too)."""
    axis = spelling("flip", "axis", axis, "dims", dims, None)
    x = as_tensor(x)
    axes = _axes(x, axis, "flip") if x.ndim else None
    return apply("flip", [x], axes=axes)
