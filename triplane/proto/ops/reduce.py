"""Reductions over any axes, with ``keepdims``."""

from __future__ import annotations

from collections.abc import Sequence

from triplane.proto import dtypes as dt
from triplane.proto.builder import Builder, Ref
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.optable import (
    Attr,
    Cost,
    GradCtx,
    GradRule,
    OpDef,
    normalise_axes,
    register,
)

REDUCE_ATTRS = {"axes": Attr("axes", None), "keepdims": Attr("bool", False)}


def reduced_shape(shape: tuple[int, ...], a: Attrs) -> tuple[int, ...]:
    axes = normalise_axes(a["axes"], len(shape))
    if a["keepdims"]:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _reduce_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(float(ins[0].size), float(ins[0].nbytes + out.nbytes))


def reduction(name: str, grad: GradRule | None, *, dtypes: frozenset[str] = dt.NUMERIC,
              out_dtype: dt.DType | None = None, doc: str = "") -> OpDef:
    def infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
        return TensorType(reduced_shape(ins[0].shape, a), out_dtype or ins[0].dtype)

    return register(OpDef(name, "reduce", 1, infer, attrs=REDUCE_ATTRS, dtypes=dtypes,
                          grad=grad, cost=_reduce_cost, doc=doc))


def expand_back(b: Builder, g: Ref, x: Ref, a: Attrs) -> Ref:
    """Broadcast a reduction's output gradient back over the reduced axes of ``x``."""
    if not a["keepdims"]:
        g = b.op("reshape", g, shape=reduced_shape(x.shape, a.replace(keepdims=True)))
    return b.op("broadcast_to", g, shape=x.shape)


def _g_sum(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    return [expand_back(b, g, n.inputs[0], n.attrs)]


reduction("sum", _g_sum, doc="Sum over axes (all when axes is null).")
