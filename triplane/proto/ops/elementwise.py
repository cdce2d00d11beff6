"""Elementwise ops: unary, binary (numpy broadcasting), and ``where``.

Binary ops take operands of one dtype; the SDK casts before it builds them.
"""

from __future__ import annotations

from collections.abc import Sequence

from triplane.proto import dtypes as dt
from triplane.proto.builder import Builder, Ref
from triplane.proto.errors import DTypeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.optable import (
    Attr,
    GradCtx,
    GradRule,
    OpDef,
    broadcast_shapes,
    elementwise_cost,
    register,
)


def _same(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    return ins[0]


def unary(name: str, grad: GradRule | None, *, dtypes: frozenset[str] = dt.FLOATS,
          flops: float = 1.0, doc: str = "") -> OpDef:
    return register(OpDef(name, "elementwise", 1, _same, dtypes=dtypes, grad=grad,
                          cost=elementwise_cost(flops), elementwise=True, doc=doc))


def _broadcast(ins: Sequence[TensorType], out_dtype: dt.DType | None = None) -> TensorType:
    dts = {t.dtype for t in ins}
    if len(dts) > 1:
        raise DTypeError("operands have dtypes " + " and ".join(t.dtype.name for t in ins)
                         + "; cast them to one dtype first")
    return TensorType(broadcast_shapes(*(t.shape for t in ins)), out_dtype or ins[0].dtype)


def binary(name: str, grad: GradRule | None, *, dtypes: frozenset[str] = dt.NUMERIC,
           flops: float = 1.0, predicate: bool = False, doc: str = "") -> OpDef:
    def infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
        return _broadcast(ins, dt.bool_ if predicate else None)

    return register(OpDef(name, "elementwise", 2, infer, dtypes=dtypes, grad=grad,
                          cost=elementwise_cost(flops), elementwise=True, doc=doc))


# --- gradient rules ---------------------------------------------------------------------


def _g_add(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [b.unbroadcast(g, x.shape), b.unbroadcast(g, y.shape)]


def _g_sub(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [b.unbroadcast(g, x.shape), b.unbroadcast(-g, y.shape)]


def _g_mul(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [b.unbroadcast(g * y, x.shape), b.unbroadcast(g * x, y.shape)]


def _g_div(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    gx = g / y
    return [b.unbroadcast(gx, x.shape), b.unbroadcast(-(gx * n.out), y.shape)]


# --- the ops ------------------------------------------------------------------------------

unary("neg", lambda b, n, g: [-g], dtypes=dt.NUMERIC)
unary("exp", lambda b, n, g: [g * n.out], flops=8)
unary("log", lambda b, n, g: [g / n.inputs[0]], flops=8)

binary("add", _g_add)
binary("sub", _g_sub)
binary("mul", _g_mul)
binary("div", _g_div)


def _infer_cast(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    return TensorType(ins[0].shape, dt.dtype(a["dtype"]))


def _g_cast(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x = n.inputs[0]
    return [b.cast(g, x.dtype)]


def _cast_grad_allowed(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    if not n.inputs[0].dtype.is_float or not n.out.dtype.is_float:
        from triplane.proto.errors import NotDifferentiableError

        raise NotDifferentiableError(
            f"cast from {n.inputs[0].dtype} to {n.out.dtype} has no gradient (not between floats)")
    return _g_cast(b, n, g)


register(OpDef("cast", "elementwise", 1, _infer_cast, attrs={"dtype": Attr("dtype")},
               grad=_cast_grad_allowed, cost=elementwise_cost(0), elementwise=True,
               doc="Convert to another dtype (numpy's astype: floats to ints truncate)."))
