"""ONNX reductions and shape operators as functions of triplane Tensors (the rest of the
import side of the op map; ``import_ops.py`` has the conventions)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from triplane.sdk import elementwise as E
from triplane.sdk import reduce as R
from triplane.sdk import shape as S
from triplane.sdk.creation import arange
from triplane.sdk.nn import functional as F
from triplane.sdk.onnx.import_ops import Node, ints, onnx_dtype, op, value
from triplane.sdk.tensor import Tensor

__all__: list[str] = []


# --- reductions --------------------------------------------------------------------------------


def _axes(n: Node, x: Tensor, axes_in: Tensor | None) -> tuple[int, ...] | None:
    """The reduced axes: the ``axes`` input (opset 13+/18+) or attribute; None for all."""
    axes = ints(axes_in) if axes_in is not None else n.get("axes")
    if not axes:
        return () if n.get("noop_with_empty_axes", 0) else None
    return tuple(int(a) % max(x.ndim, 1) for a in axes)


def _reduce(f: Any, pre: Any = None, post: Any = None) -> Any:
    def run(n: Node, x: Tensor, axes_in: Tensor | None = None) -> Tensor:
        axes = _axes(n, x, axes_in)
        keep = bool(n.get("keepdims", 1))
        y = pre(x) if pre else x
        if axes == ():
            out = y
        else:
            out = f(y, axes, keep)
        out = post(out) if post else out
        return E.cast(out, x.dtype)
    return run


for _name, _f, _pre, _post in [
        ("ReduceSum", R.sum, None, None), ("ReduceMean", R.mean, None, None),
        ("ReduceMax", R.max, None, None), ("ReduceMin", R.min, None, None),
        ("ReduceProd", R.prod, None, None), ("ReduceLogSumExp", R.logsumexp, None, None),
        ("ReduceSumSquare", R.sum, E.square, None), ("ReduceL1", R.sum, E.abs, None),
        ("ReduceL2", R.sum, E.square, E.sqrt), ("ReduceLogSum", R.sum, None, E.log)]:
    op(_name)(_reduce(_f, _pre, _post))


@op("ArgMax", "ArgMin")
def _arg(n: Node, x: Tensor) -> Tensor:
    f = R.argmax if n.op_type == "ArgMax" else R.argmin
    axis, keep = n.get("axis", 0) % x.ndim, bool(n.get("keepdims", 1))
    if n.get("select_last_index", 0):  # the first index of the reversed axis, counted back
        return E.cast(E.sub(x.shape[axis] - 1, f(S.flip(x, axis), axis, keep)), "int64")
    return E.cast(f(x, axis, keep), "int64")


# --- shapes ------------------------------------------------------------------------------------


@op("Reshape")
def _reshape(n: Node, x: Tensor, shape: Tensor) -> Tensor:
    want = ints(shape) or []
    if not n.get("allowzero", 0):
        want = [x.shape[i] if s == 0 else s for i, s in enumerate(want)]
    return S.reshape(x, tuple(want))


@op("Flatten")
def _flatten(n: Node, x: Tensor) -> Tensor:
    axis = n.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return S.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@op("Transpose")
def _transpose(n: Node, x: Tensor) -> Tensor:
    perm = n.get("perm") or list(range(x.ndim))[::-1]
    return S.transpose(x, tuple(perm))


@op("Squeeze")
def _squeeze(n: Node, x: Tensor, axes: Tensor | None = None) -> Tensor:
    a = ints(axes) if axes is not None else n.get("axes")
    if a is None:
        return S.squeeze(x)
    return S.squeeze(x, tuple(int(i) % x.ndim for i in a))


@op("Unsqueeze")
def _unsqueeze(n: Node, x: Tensor, axes: Tensor | None = None) -> Tensor:
    a = ints(axes) if axes is not None else list(n.get("axes"))
    rank = x.ndim + len(a)
    for ax in sorted(int(i) % rank for i in a):
        x = S.unsqueeze(x, ax)
    return x


@op("Concat")
def _concat(n: Node, *xs: Tensor) -> Tensor:
    return S.concat([x for x in xs if x is not None], n.get("axis"))


@op("Split")
def _split(n: Node, x: Tensor, split: Tensor | None = None) -> list[Tensor]:
    axis = n.get("axis", 0) % x.ndim
    sizes = ints(split) if split is not None else n.get("split")
    if not sizes:
        parts = n.get("num_outputs") or n.outputs
        size = x.shape[axis]
        step = -(-size // parts)
        sizes = [min(step, size - i * step) for i in range(parts)]
    return S.split(x, list(sizes), axis)


@op("Slice")
def _slice(n: Node, x: Tensor, starts: Tensor | None = None, ends: Tensor | None = None,
           axes: Tensor | None = None, steps: Tensor | None = None) -> Tensor:
    if n.opset < 10:
        st, en, ax, sp = n.get("starts"), n.get("ends"), n.get("axes"), None
    else:
        st, en, ax, sp = ints(starts), ints(ends), ints(axes), ints(steps)
    ax = list(range(len(st))) if ax is None else [a % x.ndim for a in ax]
    sp = [1] * len(st) if sp is None else sp
    lim = 2**62  # ONNX writes INT64_MAX/MIN for "to the end"; Python's slicing clamps
    st = [max(min(s, lim), -lim) for s in st]
    en = [max(min(e, lim), -lim) for e in en]
    return S.slice(x, st, en, sp, ax)


@op("Gather")
def _gather(n: Node, x: Tensor, idx: Tensor) -> Tensor:
    return S.gather(x, idx, n.get("axis", 0) % x.ndim)


@op("Expand")
def _expand(n: Node, x: Tensor, shape: Tensor) -> Tensor:
    target = tuple(np.broadcast_shapes(x.shape, tuple(ints(shape) or [])))
    return S.broadcast_to(x, target)


@op("Tile")
def _tile(n: Node, x: Tensor, reps: Tensor) -> Tensor:
    r = ints(reps) or []
    # (d0, d1, ...) -> (r0, d0, r1, d1, ...) by broadcasting, then merged
    inter = S.reshape(x, tuple(v for d in x.shape for v in (1, d)))
    big = S.broadcast_to(inter, tuple(v for k, d in zip(r, x.shape) for v in (k, d)))
    return S.reshape(big, tuple(k * d for k, d in zip(r, x.shape)))


@op("Pad")
def _pad(n: Node, x: Tensor, pads: Tensor | None = None, cval: Tensor | None = None,
         axes: Tensor | None = None) -> Tensor:
    mode = n.get("mode", "constant")
    if mode != "constant":
        raise n.refuse(f"mode={mode!r} (triplane pads with a constant)")
    p = ints(pads) if n.opset >= 11 else list(n.get("pads"))
    ax = ints(axes) if axes is not None else list(range(x.ndim))
    ax = [a % x.ndim for a in ax]
    if any(v < 0 for v in p):
        raise n.refuse("negative pads (cropping)")
    width = [[0, 0] for _ in range(x.ndim)]
    for i, a in enumerate(ax):
        width[a] = [p[i], p[i + len(ax)]]
    c = value(cval) if cval is not None else n.get("value", 0)
    c = 0 if c is None or np.size(c) == 0 else np.asarray(c).reshape(-1)[0].item()
    if isinstance(c, float) and not np.isfinite(c):  # no attribute holds it: padded, then filled in
        inner = np.pad(np.ones(x.shape, bool), width, constant_values=False)
        fill = Tensor.from_array(np.array(c, x.dtype.np))
        return E.where(Tensor.from_array(inner), S.pad(x, width, 0), fill)
    return S.pad(x, width, c)


@op("Shape")
def _shape(n: Node, x: Tensor) -> Tensor:
    s = list(x.shape)
    start, end = n.get("start", 0), n.get("end", len(s))
    return Tensor.from_array(np.array(s[start:end], np.int64))


@op("Size")
def _size(n: Node, x: Tensor) -> Tensor:
    return Tensor.from_array(np.array(x.size, np.int64))


@op("ConstantOfShape")
def _const_of_shape(n: Node, shape: Tensor) -> Tensor:
    v = n.get("value")
    arr = np.zeros(1, np.float32) if v is None else v
    return S.broadcast_to(Tensor.from_array(arr.reshape(())), tuple(ints(shape) or []))


@op("Constant")
def _constant(n: Node) -> Tensor:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in n.attrs:
            v = n.attrs[key]
            if key.startswith("value_float"):
                v = np.asarray(v, np.float32)
            elif key.startswith("value_int"):
                v = np.asarray(v, np.int64)
            return Tensor.from_array(np.asarray(v))
    raise n.refuse(f"a Constant holding {sorted(n.attrs)}")


@op("Range")
def _range(n: Node, start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
    d = start.dtype
    s, lim, st = (value(t).item() for t in (start, limit, delta))
    count = max(math.ceil((lim - s) / st), 0)
    return E.cast(E.add(E.mul(arange(count, dtype="float64" if d.is_float else "int64"), st), s), d)


@op("OneHot")
def _one_hot(n: Node, idx: Tensor, depth: Tensor, values: Tensor) -> Tensor:
    k = int(value(depth).reshape(-1)[0])
    idx = E.cast(idx, "int64")
    idx = E.where(E.lt(idx, 0), E.add(idx, k), idx)  # ONNX counts negative indices from the end
    inside = E.logical_and(E.ge(idx, 0), E.lt(idx, k))  # an index out of range is a row of "off"
    hot = E.logical_and(F.one_hot(E.where(inside, idx, 0), k, dtype="bool"), S.unsqueeze(inside, -1))
    axis = n.get("axis", -1)
    if axis != -1:
        hot = _move_last(hot, axis)
    off, on = values[0:1].reshape(()), values[1:2].reshape(())
    return E.where(hot, on, off)


def _move_last(x: Tensor, axis: int) -> Tensor:
    ax = axis % x.ndim
    perm = list(range(x.ndim - 1))
    perm.insert(ax, x.ndim - 1)
    return S.transpose(x, tuple(perm))


@op("EyeLike")
def _eye_like(n: Node, x: Tensor) -> Tensor:
    from triplane.sdk.creation import eye

    d = onnx_dtype(n.get("dtype"), n) if n.get("dtype") is not None else x.dtype
    return eye(x.shape[0], x.shape[1], k=n.get("k", 0), dtype=d.name)


@op("GatherElements")
def _gather_elements(n: Node, data: Tensor, idx: Tensor) -> Tensor:
    """out[..., i_a, ...] = data[..., idx[..., i_a, ...], ...] along ``axis``: a one-hot of
    the indices selects from ``data`` (its other axes cut to the indices' sizes)."""
    a = n.get("axis", 0) % data.ndim
    k = data.shape[a]
    idx = E.cast(idx, "int64")
    idx = E.where(E.lt(idx, 0), E.add(idx, k), idx)
    hot = F.one_hot(idx, k, dtype="bool")  # idx.shape + (k,)
    stops = [k if d == a else idx.shape[d] for d in range(data.ndim)]
    cut = S.slice(data, [0] * data.ndim, stops, [1] * data.ndim, list(range(data.ndim)))
    last = S.transpose(cut, (*[d for d in range(data.ndim) if d != a], a))
    picked = E.where(hot, S.unsqueeze(last, a), Tensor.from_array(np.zeros((), data.dtype.np)))
    return E.cast(R.sum(picked, -1), data.dtype)


@op("Hardmax")
def _hardmax(n: Node, x: Tensor) -> Tensor:
    axis = n.get("axis", -1) % x.ndim
    hot = F.one_hot(R.argmax(x, axis), x.shape[axis], dtype=x.dtype.name)  # the first maximum
    return _move_last(hot, axis) if axis != x.ndim - 1 else hot


@op("Compress")
def _compress(n: Node, x: Tensor, cond: Tensor) -> Tensor:
    keep = np.nonzero(value(cond).reshape(-1))[0]
    axis = n.get("axis")
    if axis is None:
        x, axis = S.reshape(x, (x.size,)), 0
    return S.gather(x, Tensor.from_array(keep.astype(np.int64)), axis % x.ndim)


@op("GatherND")
def _gather_nd(n: Node, data: Tensor, idx: Tensor) -> Tensor:
    if n.get("batch_dims", 0):
        raise n.refuse("batch_dims other than 0")
    k = idx.shape[-1]
    dims = data.shape[:k]
    idx = E.cast(idx, "int64")
    idx = E.where(E.lt(idx, 0), E.add(idx, Tensor.from_array(np.array(dims, np.int64))), idx)
    strides = np.array([int(np.prod(dims[i + 1:])) for i in range(k)], np.int64)
    flat = R.sum(E.mul(idx, Tensor.from_array(strides)), -1)  # the row of data reshaped to (prod(dims), ...)
    return S.gather(S.reshape(data, (int(np.prod(dims)), *data.shape[k:])), flat, 0)
