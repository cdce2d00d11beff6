"""Linear algebra: matmul with numpy's semantics (batched, batch dims broadcast)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from triplane.proto import dtypes as dt
from triplane.proto.errors import DTypeError, ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import Cost, GradCtx, OpDef, OpGroup, SplitDecl, broadcast_shapes

if TYPE_CHECKING:
    from triplane.proto.builder import Builder, Ref

OPS = OpGroup("linalg")  # registered by triplane.proto.ops.register_all


def _infer_matmul(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, y = ins
    if x.dtype != y.dtype:
        raise DTypeError(f"operands have dtypes {x.dtype} and {y.dtype}; cast them to one dtype first")
    if x.ndim == 0 or y.ndim == 0:
        raise ShapeError(f"matmul needs operands of at least 1 dimension, got {x.shape} @ {y.shape}")
    xs = x.shape if x.ndim > 1 else (1, *x.shape)
    ys = y.shape if y.ndim > 1 else (*y.shape, 1)
    if xs[-1] != ys[-2]:
        raise ShapeError(f"inner dimensions differ: {x.shape} @ {y.shape} ({xs[-1]} != {ys[-2]})")
    try:
        batch = broadcast_shapes(xs[:-2], ys[:-2])
    except ShapeError:
        raise ShapeError(f"batch dimensions do not broadcast: {x.shape} @ {y.shape}") from None
    out = (*batch, xs[-2], ys[-1])
    if x.ndim == 1:
        out = out[:-2] + out[-1:]
    if y.ndim == 1:
        out = out[:-1]
    return TensorType(out, x.dtype)


def _matmul_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    k = ins[0].shape[-1]
    return Cost(2.0 * out.size * k, float(sum(t.nbytes for t in ins) + out.nbytes))


def _swap_last(b: Builder, r: Ref) -> Ref:
    perm = list(range(r.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return b.op("transpose", r, perm=perm)


def _g_matmul(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    x2 = x if x.ndim > 1 else b.op("reshape", x, shape=(1, x.shape[0]))
    y2 = y if y.ndim > 1 else b.op("reshape", y, shape=(y.shape[0], 1))
    g_shape = (*broadcast_shapes(x2.shape[:-2], y2.shape[:-2]), x2.shape[-2], y2.shape[-1])
    g2 = g if g.shape == g_shape else b.op("reshape", g, shape=g_shape)
    gx = b.unbroadcast(b.op("matmul", g2, _swap_last(b, y2)), x2.shape)
    gy = b.unbroadcast(b.op("matmul", _swap_last(b, x2), g2), y2.shape)
    if gx.shape != x.shape:
        gx = b.op("reshape", gx, shape=x.shape)
    if gy.shape != y.shape:
        gy = b.op("reshape", gy, shape=y.shape)
    return [gx, gy]


OPS.declare(OpDef("matmul", "linalg", 2, _infer_matmul, dtypes=dt.NUMERIC, grad=_g_matmul,
                  cost=_matmul_cost, split=SplitDecl("matmul", "add"),
                  doc="numpy.matmul: batched, batch dimensions broadcast."))
