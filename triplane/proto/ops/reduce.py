"""Reductions over any axes, with ``keepdims``.

OPS = OpGroup("reduce")  # registered by triplane.proto.ops.register_all

Value reductions (sum, mean, max, min, prod, var, logsumexp) take attrs ``axes`` (null
for all axes, an int or a list; negative axes count from the end) and ``keepdims``.
Index reductions (argmax, argmin) take one ``axis`` (null: over the flattened tensor) and
``keepdims``, and give int64 indices; they are not differentiable.

Dtypes: sum, prod keep the input dtype (integers wrap on overflow, as numpy's fixed-width
sums do); max, min keep it too and also accept bool; mean, var and logsumexp take floats
only (the SDK casts integers to the default float first).

Empty reductions (an axis of size 0) follow numpy where numpy gives a value: sum = 0,
prod = 1, mean = nan (0/0), logsumexp = -inf (log of an empty sum). Where numpy raises
(max, min, argmax, argmin of nothing) inference raises ShapeError naming the op and the
shape. var raises ShapeError when ``N - ddof <= 0`` (numpy would warn and return inf/nan).

Gradient rules, with ``g`` broadcast back over the reduced axes:

- mean: g / N.
- max/min: the gradient is split equally among tied extrema:
  ``g * mask / count`` with ``mask = cast(eq(x, out))`` and ``count = sum(mask)``.
- prod: the product of the *other* elements, computed without dividing by zero: with
  ``z`` the number of zeros in the reduced slice and ``p`` the product of its non-zero
  elements, d out / d x_i is ``p / x_i`` when ``z == 0``, ``p`` at the zero when ``z == 1``
  (0 elsewhere in that slice), and 0 when ``z >= 2``.
- var: g * 2 (x - mean) / (N - ddof).
- logsumexp: g * exp(x - out) (the softmax weights).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from triplane.proto import dtypes as dt
from triplane.proto.errors import ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import (
    Attr,
    Cost,
    CostFn,
    GradCtx,
    GradRule,
    InferFn,
    OpDef,
    OpGroup,
    SplitDecl,
    normalise_axes,
    normalise_axis,
)

if TYPE_CHECKING:
    from triplane.proto.builder import Builder, Ref

OPS = OpGroup("reduce")  # registered by triplane.proto.ops.register_all

REDUCE_ATTRS = {"axes": Attr("axes", None), "keepdims": Attr("bool", False)}


def reduced_axes(shape: tuple[int, ...], a: Attrs) -> tuple[int, ...]:
    """The reduced axes, sorted and non-negative; ShapeError naming the shape if invalid."""
    try:
        return normalise_axes(a["axes"], len(shape))
    except ShapeError as e:
        raise ShapeError(f"{e.reason} of shape {shape}") from None


def reduced_shape(shape: tuple[int, ...], a: Attrs) -> tuple[int, ...]:
    axes = reduced_axes(shape, a)
    if a["keepdims"]:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def reduced_count(shape: tuple[int, ...], a: Attrs) -> int:
    """How many elements each output element of the reduction combines."""
    return math.prod(shape[i] for i in reduced_axes(shape, a))


def _reduce_cost(flops: float) -> CostFn:
    def cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
        return Cost(flops * ins[0].size, float(ins[0].nbytes + out.nbytes))

    return cost


def _need_elements(name: str, x: TensorType, axes: tuple[int, ...]) -> None:
    if any(x.shape[i] == 0 for i in axes):
        raise ShapeError(f"{name} of an empty set: axes {list(axes)} of shape {x.shape} "
                         "include a dimension of size 0")


def reduction(name: str, grad: GradRule | None, *, dtypes: frozenset[str] = dt.NUMERIC,
              nonempty: bool = False, flops: float = 1.0, extra: dict[str, Attr] | None = None,
              combine: str | None = None, doc: str = "") -> OpDef:
    """Register a value reduction. ``nonempty`` ops reject a reduction over nothing.
    ``combine`` is the op that merges partial reductions (None: split only along kept axes)."""

    def infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
        x = ins[0]
        shape = reduced_shape(x.shape, a)
        if nonempty:
            _need_elements(name, x, reduced_axes(x.shape, a))
        return TensorType(shape, x.dtype)

    return OPS.declare(OpDef(name, "reduce", 1, infer, attrs={**REDUCE_ATTRS, **(extra or {})},
                             dtypes=dtypes, grad=grad, cost=_reduce_cost(flops),
                             split=SplitDecl("reduce", combine), doc=doc))


def keep(b: Builder, r: Ref, x: Ref, a: Attrs) -> Ref:
    """``r`` (a reduction's output or its gradient) with the reduced axes kept as size 1."""
    if a["keepdims"]:
        return r
    kept = reduced_shape(x.shape, a.replace(keepdims=True))
    return r if r.shape == kept else b.op("reshape", r, shape=kept)


def expand_back(b: Builder, g: Ref, x: Ref, a: Attrs) -> Ref:
    """Broadcast a reduction's output gradient back over the reduced axes of ``x``."""
    g = keep(b, g, x, a)
    return g if g.shape == x.shape else b.op("broadcast_to", g, shape=x.shape)


# --- gradient rules ------------------------------------------------------------------------


def _g_sum(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    return [expand_back(b, g, n.inputs[0], n.attrs)]


def _g_mean(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x = n.inputs[0]
    # Over nothing there is no input element to receive a gradient; avoid dividing by 0.
    count = reduced_count(x.shape, n.attrs) or 1
    return [expand_back(b, g / float(count), x, n.attrs)]


def _g_extremum(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, a = n.inputs[0], n.attrs
    out_b = expand_back(b, n.out, x, a)
    mask = b.cast(b.op("eq", x, out_b), x.dtype)
    count = b.op("sum", mask, axes=normalise_axes(a["axes"], x.ndim), keepdims=True)
    return [mask * (keep(b, g, x, a) / count)]  # mul broadcasts the share over the slice


def _g_prod(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, a = n.inputs[0], n.attrs
    axes = normalise_axes(a["axes"], x.ndim)
    zero = b.const(0, x.dtype)
    is_zero = b.op("eq", x, zero)
    safe = b.op("where", is_zero, b.const(1, x.dtype), x)
    nonzero_prod = b.op("prod", safe, axes=axes, keepdims=True)
    zeros = b.op("sum", b.cast(is_zero, x.dtype), axes=axes, keepdims=True)
    none_zero = b.cast(b.op("eq", zeros, zero), x.dtype)
    one_zero = b.cast(b.op("eq", zeros, b.const(1, x.dtype)), x.dtype)
    at_zero = b.op("broadcast_to", nonzero_prod * one_zero, shape=x.shape)
    elsewhere = b.op("broadcast_to", nonzero_prod * none_zero, shape=x.shape) / safe
    return [expand_back(b, g, x, a) * b.op("where", is_zero, at_zero, elsewhere)]


def _g_var(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, a = n.inputs[0], n.attrs
    axes = normalise_axes(a["axes"], x.ndim)
    count = reduced_count(x.shape, a)
    mean = b.op("sum", x, axes=axes, keepdims=True) / float(count)
    centred = x - b.op("broadcast_to", mean, shape=x.shape)
    return [expand_back(b, g, x, a) * centred * (2.0 / (count - a["ddof"]))]


def _g_logsumexp(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, a = n.inputs[0], n.attrs
    weights = b.op("exp", x - expand_back(b, n.out, x, a))
    return [expand_back(b, g, x, a) * weights]


# --- the ops -------------------------------------------------------------------------------

reduction("sum", _g_sum, combine="add", doc="Sum over axes (all when axes is null); 0 over nothing.")
reduction("prod", _g_prod, combine="mul", doc="Product over axes; 1 over nothing.")
reduction("max", _g_extremum, dtypes=dt.EVERY, nonempty=True, combine="maximum",
          doc="Maximum over axes (nan propagates); ties share the gradient equally.")
reduction("min", _g_extremum, dtypes=dt.EVERY, nonempty=True, combine="minimum",
          doc="Minimum over axes (nan propagates); ties share the gradient equally.")
reduction("mean", _g_mean, dtypes=dt.FLOATS, flops=1.0, combine="add",
          doc="Mean over axes; nan over nothing.")
reduction("logsumexp", _g_logsumexp, dtypes=dt.FLOATS, flops=10.0,
          doc="log(sum(exp(x))) computed stably (max subtracted first); -inf over nothing.")


def _check_ddof(v: int) -> str | None:
    return "must be >= 0" if v < 0 else None


def _infer_var(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    count = reduced_count(x.shape, a)
    if count - a["ddof"] <= 0:
        raise ShapeError(f"var with ddof={a['ddof']} over {count} element(s) (axes {a['axes']} of "
                         f"shape {x.shape}) has no degrees of freedom")
    return TensorType(reduced_shape(x.shape, a), x.dtype)


OPS.declare(OpDef("var", "reduce", 1, _infer_var,
                  attrs={**REDUCE_ATTRS, "ddof": Attr("int", 0, check=_check_ddof)},
                  dtypes=dt.FLOATS, grad=_g_var, cost=_reduce_cost(3.0), split=SplitDecl("reduce"),
                  doc="Variance over axes: sum((x - mean)^2) / (N - ddof)."))


# --- index reductions ----------------------------------------------------------------------

ARG_ATTRS = {"axis": Attr("int", None, nullable=True), "keepdims": Attr("bool", False)}


def _infer_arg(name: str) -> InferFn:
    def infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
        x = ins[0]
        if a["axis"] is None:
            _need_elements(name, x, tuple(range(x.ndim)))
            return TensorType((1,) * x.ndim if a["keepdims"] else (), dt.int64)
        if x.ndim == 0 or not -x.ndim <= a["axis"] < x.ndim:
            raise ShapeError(f"axis {a['axis']} is out of range for shape {x.shape}")
        ax = normalise_axis(a["axis"], x.ndim)
        _need_elements(name, x, (ax,))
        shape = tuple(1 if i == ax else s for i, s in enumerate(x.shape)) if a["keepdims"] \
            else x.shape[:ax] + x.shape[ax + 1:]
        return TensorType(shape, dt.int64)

    return infer


for _name in ("argmax", "argmin"):
    OPS.declare(OpDef(_name, "reduce", 1, _infer_arg(_name), attrs=ARG_ATTRS, dtypes=dt.EVERY,
                      grad=None, cost=_reduce_cost(1.0), split=SplitDecl("argreduce"),
                      doc=f"int64 index of the first {_name[3:]}imum along axis (flattened when null)."))
