"""Shape ops: views and rearrangements of elements. None computes anything.

The IR is explicit: ``reshape`` has no -1, ``slice`` has one in-range ``start``/``stop``
and a positive ``step`` per axis (the SDK lowers negative steps to ``slice`` + ``flip``
and integer indices to ``slice`` + ``reshape``). Negative axes are accepted in attributes
(they count from the end) but the SDK writes them non-negative.

Internal ops (made by gradient rules, not by users): ``unslice`` (the adjoint of
``slice``: the gradient placed into zeros of the input's shape) and ``scatter_add`` (the
adjoint of ``gather``: values added at the indexed positions, repeated indices summing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from triplane.proto import dtypes as dt
from triplane.proto.errors import DTypeError, ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import (
    Attr,
    Cost,
    GradCtx,
    OpDef,
    OpGroup,
    SplitDecl,
    normalise_axes,
    normalise_axis,
)

if TYPE_CHECKING:
    from triplane.proto.builder import Builder, Ref

OPS = OpGroup("shape")  # registered by triplane.proto.ops.register_all


def _move_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(0.0, float(sum(t.nbytes for t in ins) + out.nbytes))


def _shape_op(name: str, infer: Any, attrs: dict[str, Attr], grad: Any, doc: str, *,
              arity: int | None = 1, internal: bool = False, nograd: frozenset[int] = frozenset(),
              split: bool = True, view: bool = False) -> OpDef:
    # Each shape op's split rule maps tile indices through the op (kind = the op's name).
    return OPS.declare(OpDef(name, "shape", arity, infer, attrs=attrs, grad=grad, cost=_move_cost,
                             internal=internal, nograd_inputs=nograd,
                             split=SplitDecl(name) if split else None, view=view, doc=doc))


def _back_to(b: Builder, g: Ref, x: Ref) -> Ref:
    return g if g.shape == x.shape else b.op("reshape", g, shape=x.shape)


# --- reshape, transpose, broadcast_to, squeeze, unsqueeze ---------------------------------------


def _infer_reshape(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    shape = tuple(a["shape"])
    if math.prod(shape) != x.size:
        raise ShapeError(f"cannot reshape {x.shape} ({x.size} elements) to {shape} "
                         f"({math.prod(shape)} elements)")
    return TensorType(shape, x.dtype)


_shape_op("reshape", _infer_reshape, {"shape": Attr("shape")},
          lambda b, n, g: [b.op("reshape", g, shape=n.inputs[0].shape)],
          "Same elements, new shape (sizes must match; no -1 in the IR).")


def _infer_transpose(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    perm = tuple(a["perm"])
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {x.ndim} axes of {x.shape}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _g_transpose(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    perm = n.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [b.op("transpose", g, perm=inverse)]


_shape_op("transpose", _infer_transpose, {"perm": Attr("ints")}, _g_transpose,
          "Permute axes (numpy.transpose); perm lists every axis once, non-negative.", view=True)


def _infer_broadcast_to(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    shape = tuple(a["shape"])
    ok = len(shape) >= x.ndim and all(
        s == d or s == 1 for s, d in zip(x.shape[::-1], shape[::-1]))
    if not ok:
        raise ShapeError(f"cannot broadcast {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


_shape_op("broadcast_to", _infer_broadcast_to, {"shape": Attr("shape")},
          lambda b, n, g: [b.unbroadcast(g, n.inputs[0].shape)], "numpy.broadcast_to.", view=True)


def _infer_squeeze(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    if a["axes"] is None:
        drop = {i for i, s in enumerate(x.shape) if s == 1}
    else:
        drop = set(normalise_axes(a["axes"], x.ndim))
        bad = [i for i in sorted(drop) if x.shape[i] != 1]
        if bad:
            raise ShapeError(f"cannot squeeze axis {bad[0]} of shape {x.shape}: its size is "
                             f"{x.shape[bad[0]]}, not 1")
    return TensorType(tuple(s for i, s in enumerate(x.shape) if i not in drop), x.dtype)


_shape_op("squeeze", _infer_squeeze, {"axes": Attr("axes", None)},
          lambda b, n, g: [_back_to(b, g, n.inputs[0])],
          "Remove axes of size 1 (all of them when axes is null).")


def _infer_unsqueeze(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    if a["axes"] is None:
        raise ShapeError("unsqueeze needs the positions of the new axes")
    nd = x.ndim + len(a["axes"])
    try:
        new = normalise_axes(a["axes"], nd)
    except ShapeError as e:
        raise ShapeError(f"{e.reason} (new axes {list(a['axes'])} for {x.shape})") from None
    dims = iter(x.shape)
    return TensorType(tuple(1 if i in new else next(dims) for i in range(nd)), x.dtype)


_shape_op("unsqueeze", _infer_unsqueeze, {"axes": Attr("axes")},
          lambda b, n, g: [_back_to(b, g, n.inputs[0])],
          "Insert axes of size 1; axes are positions in the output.")


# --- concat, stack ----------------------------------------------------------------------------


def _same_dtype(ins: Sequence[TensorType]) -> dt.DType:
    if len({t.dtype for t in ins}) > 1:
        raise DTypeError("inputs have dtypes " + ", ".join(t.dtype.name for t in ins)
                         + "; cast them to one dtype first")
    return ins[0].dtype


def _infer_concat(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    d = _same_dtype(ins)
    first = ins[0]
    if first.ndim == 0:
        raise ShapeError("cannot concatenate 0-d tensors (stack them instead)")
    ax = normalise_axis(a["axis"], first.ndim)
    for t in ins[1:]:
        if t.ndim != first.ndim or any(s != f for i, (s, f) in enumerate(zip(t.shape, first.shape))
                                       if i != ax):
            raise ShapeError("shapes " + ", ".join(str(u.shape) for u in ins)
                             + f" differ outside axis {ax}")
    shape = list(first.shape)
    shape[ax] = sum(t.shape[ax] for t in ins)
    return TensorType(tuple(shape), d)


def _g_concat(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    ax = normalise_axis(n.attrs["axis"], g.ndim)
    grads: list[Ref | None] = []
    start = 0
    for x in n.inputs:
        stop = start + x.shape[ax]
        grads.append(slice_axis(b, g, ax, start, stop))
        start = stop
    return grads


_shape_op("concat", _infer_concat, {"axis": Attr("int", 0)}, _g_concat,
          "Join tensors along an existing axis (numpy.concatenate).", arity=None)


def _infer_stack(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    d = _same_dtype(ins)
    first = ins[0]
    if any(t.shape != first.shape for t in ins):
        raise ShapeError("cannot stack tensors of different shapes: "
                         + ", ".join(str(t.shape) for t in ins))
    ax = normalise_axis(a["axis"], first.ndim + 1)
    return TensorType((*first.shape[:ax], len(ins), *first.shape[ax:]), d)


def _g_stack(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    ax = normalise_axis(n.attrs["axis"], g.ndim)
    return [b.op("reshape", slice_axis(b, g, ax, i, i + 1), shape=x.shape)
            for i, x in enumerate(n.inputs)]


_shape_op("stack", _infer_stack, {"axis": Attr("int", 0)}, _g_stack,
          "Join tensors of one shape along a new axis (numpy.stack).", arity=None)


# --- slice and its adjoint --------------------------------------------------------------------

_SLICE_ATTRS = {"starts": Attr("ints"), "stops": Attr("ints"), "steps": Attr("ints")}


def sliced_shape(shape: tuple[int, ...], a: Attrs) -> tuple[int, ...]:
    """The shape ``slice`` gives; ShapeError unless every start/stop/step is explicit and in
    range: ``0 <= start <= stop <= dim`` and ``step >= 1``."""
    starts, stops, steps = a["starts"], a["stops"], a["steps"]
    if not len(starts) == len(stops) == len(steps) == len(shape):
        raise ShapeError(f"starts {list(starts)}, stops {list(stops)} and steps {list(steps)} "
                         f"need one entry per axis of {shape}")
    out = []
    for i, (n, lo, hi, st) in enumerate(zip(shape, starts, stops, steps)):
        if not (0 <= lo <= hi <= n and st >= 1):
            raise ShapeError(f"axis {i}: slice {lo}:{hi}:{st} is not within 0 <= start <= stop <= "
                             f"{n} with step >= 1 (shape {shape})")
        out.append(-(-(hi - lo) // st))
    return tuple(out)


def slice_axis(b: Builder, x: Ref, axis: int, start: int, stop: int, step: int = 1) -> Ref:
    """``x`` sliced ``start:stop:step`` along one axis (a builder helper for gradient rules)."""
    starts, stops, steps = [0] * x.ndim, list(x.shape), [1] * x.ndim
    starts[axis], stops[axis], steps[axis] = start, stop, step
    if starts == [0] * x.ndim and stops == list(x.shape) and step == 1:
        return x
    return b.op("slice", x, starts=starts, stops=stops, steps=steps)


def _infer_slice(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    return TensorType(sliced_shape(ins[0].shape, a), ins[0].dtype)


def _g_slice(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    a = n.attrs
    return [b.op("unslice", g, shape=n.inputs[0].shape, starts=a["starts"], stops=a["stops"],
                 steps=a["steps"])]


_shape_op("slice", _infer_slice, _SLICE_ATTRS, _g_slice,
          "x[start:stop:step] on every axis; 0 <= start <= stop <= dim, step >= 1.", view=True)


def _infer_unslice(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    g = ins[0]
    shape = tuple(a["shape"])
    want = sliced_shape(shape, a)
    if want != g.shape:
        raise ShapeError(f"a slice of {shape} has shape {want}, but the values have shape {g.shape}")
    return TensorType(shape, g.dtype)


def _g_unslice(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    a = n.attrs
    return [b.op("slice", g, starts=a["starts"], stops=a["stops"], steps=a["steps"])]


_shape_op("unslice", _infer_unslice, {"shape": Attr("shape"), **_SLICE_ATTRS}, _g_unslice,
          "Zeros of shape with the input written at the slice positions (slice's adjoint).",
          internal=True, split=False)


# --- gather and its adjoint -------------------------------------------------------------------


def _check_index(idx: TensorType, what: str) -> None:
    if not idx.dtype.is_int:
        raise DTypeError(f"{what} indices must be integers, got {idx.dtype.name} of shape {idx.shape}")


def _infer_gather(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, idx = ins
    _check_index(idx, "gather")
    if x.ndim == 0:
        raise ShapeError(f"cannot gather from a 0-d tensor (index shape {idx.shape})")
    ax = normalise_axis(a["axis"], x.ndim)
    return TensorType((*x.shape[:ax], *idx.shape, *x.shape[ax + 1:]), x.dtype)


def _g_gather(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, idx = n.inputs
    ax = normalise_axis(n.attrs["axis"], x.ndim)
    return [b.op("scatter_add", g, idx, axis=ax, size=x.shape[ax]), None]


_shape_op("gather", _infer_gather, {"axis": Attr("int", 0)}, _g_gather,
          "numpy.take(x, index, axis): index of any shape, values in [-dim, dim) (negative "
          "counts from the end); out of range is a KernelError at run time.",
          arity=2, nograd=frozenset({1}))


def _check_size(v: int) -> str | None:
    return "must be >= 0" if v < 0 else None


def _infer_scatter_add(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    g, idx = ins
    _check_index(idx, "scatter_add")
    ax = a["axis"]
    if not 0 <= ax <= g.ndim - idx.ndim or g.shape[ax:ax + idx.ndim] != idx.shape:
        raise ShapeError(f"values of shape {g.shape} do not hold index shape {idx.shape} at axis {ax}")
    return TensorType((*g.shape[:ax], a["size"], *g.shape[ax + idx.ndim:]), g.dtype)


def _g_scatter_add(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    return [b.op("gather", g, n.inputs[1], axis=n.attrs["axis"]), None]


_shape_op("scatter_add", _infer_scatter_add, {"axis": Attr("int"), "size": Attr("int", check=_check_size)},
          _g_scatter_add, "Zeros with dim `size` at axis, values added at the indexed positions "
          "(gather's adjoint; axis is non-negative).", arity=2, internal=True, nograd=frozenset({1}),
          split=False)


# --- pad, flip --------------------------------------------------------------------------------


def _check_pads(v: Any) -> str | None:
    ok = isinstance(v, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2
        and all(isinstance(q, int) and not isinstance(q, bool) and q >= 0 for q in p) for p in v)
    return None if ok else "must be a list of [before, after] pairs of non-negative integers"


def _check_number(v: Any) -> str | None:
    return None if isinstance(v, (bool, int, float)) else "must be a number or a boolean"


def _infer_pad(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    pads = a["pads"]
    if len(pads) != x.ndim:
        raise ShapeError(f"pads {[list(p) for p in pads]} need one [before, after] pair per axis "
                         f"of {x.shape}")
    return TensorType(tuple(s + lo + hi for s, (lo, hi) in zip(x.shape, pads)), x.dtype)


def _g_pad(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, pads = n.inputs[0], n.attrs["pads"]
    return [b.op("slice", g, starts=[lo for lo, _ in pads],
                 stops=[lo + s for (lo, _), s in zip(pads, x.shape)], steps=[1] * x.ndim)]


_shape_op("pad", _infer_pad, {"pads": Attr("any", check=_check_pads),
                              "mode": Attr("str", "constant", choices=("constant",)),
                              "value": Attr("any", 0, check=_check_number)}, _g_pad,
          "Pad with a constant value: pads = [[before, after], ...] one pair per axis.")


def _infer_flip(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    normalise_axes(a["axes"], ins[0].ndim)
    return ins[0]


_shape_op("flip", _infer_flip, {"axes": Attr("axes", None)},
          lambda b, n, g: [b.op("flip", g, axes=n.attrs["axes"])],
          "Reverse the order of elements along axes (all when axes is null).")
