"""Shape ops: views and rearrangements of elements. None computes anything."""

from __future__ import annotations

import math
from collections.abc import Sequence

from triplane.proto.builder import Builder, Ref
from triplane.proto.errors import ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.optable import Attr, Cost, GradCtx, OpDef, register


def _move_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(0.0, float(ins[0].nbytes + out.nbytes))


def _infer_reshape(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    shape = tuple(a["shape"])
    if math.prod(shape) != x.size:
        raise ShapeError(f"cannot reshape {x.shape} ({x.size} elements) to {shape} "
                         f"({math.prod(shape)} elements)")
    return TensorType(shape, x.dtype)


register(OpDef("reshape", "shape", 1, _infer_reshape, attrs={"shape": Attr("shape")},
               grad=lambda b, n, g: [b.op("reshape", g, shape=n.inputs[0].shape)],
               cost=_move_cost, doc="Same elements, new shape (sizes must match; no -1 in the IR)."))


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


register(OpDef("transpose", "shape", 1, _infer_transpose, attrs={"perm": Attr("ints")},
               grad=_g_transpose, cost=_move_cost, doc="Permute axes (numpy.transpose)."))


def _infer_broadcast_to(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    shape = tuple(a["shape"])
    ok = len(shape) >= x.ndim and all(
        s == d or s == 1 for s, d in zip(x.shape[::-1], shape[::-1]))
    if not ok:
        raise ShapeError(f"cannot broadcast {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


register(OpDef("broadcast_to", "shape", 1, _infer_broadcast_to, attrs={"shape": Attr("shape")},
               grad=lambda b, n, g: [b.unbroadcast(g, n.inputs[0].shape)],
               cost=_move_cost, doc="numpy.broadcast_to."))
