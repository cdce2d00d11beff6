"""Split rules: how a tile of an op's output is computed from regions of its inputs.

Every op of the table declares ``split=SplitDecl(kind, combine)`` next to its inference
and cost; this module implements each kind. A rule looks at one node and answers with a
:class:`Space` (or None: the node is taken whole, as one tile):

* ``axes``: the axes along which the node may be cut. An axis with ``out_dim`` cuts that
  dimension of the output (an *S* split, in SBP terms); an axis without one is a
  *contraction* axis (matmul's K, a reduction's reduced axes): cutting it makes partial
  results (*P*) that ``combine`` (a binary op: add, mul, maximum, minimum) merges in a
  tree, and ``finish`` then turns into the value once (mean: divide by the count).
  ``aligns`` lists the input dimensions whose index along the axis equals the axis's
  index, so the tiler can adopt the producer's cuts and avoid a regroup.
* ``task(ranges, partial)``: the tile op for one range per axis (axes not mentioned are
  whole): op name, attributes, and the region of each input it reads. ``partial`` says
  whether some contraction axis is cut (mean then sums, and finish divides).
* ``makes_regions``: a source (``input``, ``full``, ``eye``, random ops) that can make
  any region of itself directly, so a consumer never needs a regroup of it.

Inputs read whole (a broadcast dim, the class axis of softmax, conv weights when the
output channels are not cut) appear in the task with their full region.

Kinds: see :data:`RULES`, which adds the shape ops' rules (:mod:`.shape_rules`). The
framework (Axis, Task, Space and shared helpers) is :mod:`.space`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.builder import Builder, Ref
from triplane.proto.ir import Node, TensorType
from triplane.proto.opdef import SplitDecl, broadcast_shapes, normalise_axes, normalise_axis
from triplane.proto.ops.fused import body_type, reduce_step
from triplane.scheduler.compiler.tiling.grid import Region, full_region, region_shape
from triplane.scheduler.compiler.tiling.shape_rules import SHAPE_RULES
from triplane.scheduler.compiler.tiling.space import (
    Axis,
    Ranges,
    Rule,
    Space,
    Task,
    bcast_aligns,
    bcast_region,
    dim_axes,
    out_reg,
    rng,
)

__all__ = ["RULES", "space_of"]

def space_of(node: Node, ins: Sequence[TensorType], decl: SplitDecl | None) -> Space | None:
    """The split space of ``node`` (None: take it whole). Unknown kinds are taken whole, so
    an op table newer than this pass still compiles."""
    if decl is None:
        return None
    rule = RULES.get(decl.kind)
    return rule(node, ins, decl) if rule is not None else None


def _divide_by(count: int) -> Callable[[Builder, Ref], Ref]:
    def finish(b: Builder, ref: Ref) -> Ref:
        return b.op("div", ref, b.const(float(count), ref.dtype))

    return finish


# --- elementwise, dropout ------------------------------------------------------------------


def _elementwise(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    out, n = node.shape, len(node.shape)

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        return Task(node.op, node.attrs, tuple((i, bcast_region(reg, t.shape)) for i, t in enumerate(ins)))

    return Space(dim_axes(out, lambda d: bcast_aligns(d, n, ins, out)), task)


def with_region(attrs: Mapping[str, Any], reg: Region, shape: Sequence[int]) -> dict[str, Any]:
    """Region attributes for a tile ``reg`` of a random tensor of ``shape`` (composing with
    a region the node already is)."""
    full, start = attrs.get("full_shape"), attrs.get("start")
    if full is None or start is None:
        full, start = tuple(shape), (0,) * len(shape)
    return {**attrs, "full_shape": tuple(full),
            "start": tuple(s + lo for s, (lo, _) in zip(start, reg))}


def _dropout(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    out = node.shape

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        return Task("dropout", with_region(node.attrs, reg, out), ((0, reg),))

    return Space(dim_axes(out, lambda d: ((0, d),)), task)


# --- sources -------------------------------------------------------------------------------


def _source(make: Callable[[Region], Task]) -> Rule:
    def rule(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
        out = node.shape
        return Space(dim_axes(out, lambda d: ()), lambda r, p: make(out_reg(r, out)), makes_regions=True)

    return rule


def _input(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    # The tiler keeps the uploaded tensor whole as the node itself (input 0 of the task
    # below); its tiles are slices of it.
    def make(reg: Region) -> Task:
        return Task("slice", {"starts": tuple(lo for lo, _ in reg), "stops": tuple(hi for _, hi in reg),
                              "steps": (1,) * len(reg)}, ((0, reg),))

    return _source(make)(node, ins, decl)


def _full(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    return _source(lambda reg: Task("full", {**node.attrs, "shape": region_shape(reg)}))(node, ins, decl)


def _eye(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    # Element (i, j) of the region is element (r0 + i, c0 + j) of the whole: one where
    # j - i == k + r0 - c0.
    def make(reg: Region) -> Task:
        (r0, r1), (c0, c1) = reg
        return Task("eye", {"n": r1 - r0, "m": c1 - c0, "k": node.attrs["k"] + r0 - c0,
                            "dtype": node.attrs["dtype"]})

    return _source(make)(node, ins, decl)


def _random(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    def make(reg: Region) -> Task:
        attrs = with_region(node.attrs, reg, node.shape)
        return Task(node.op, {**attrs, "shape": region_shape(reg)})

    return _source(make)(node, ins, decl)


# --- matmul ----------------------------------------------------------------------------------


def _matmul(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x, y = ins
    xs = x.shape if x.ndim > 1 else (1, *x.shape)
    ys = y.shape if y.ndim > 1 else (*y.shape, 1)
    batch = broadcast_shapes(xs[:-2], ys[:-2])
    nb = len(batch)
    m, k, n = xs[-2], xs[-1], ys[-1]
    axes = []
    for b in range(nb):
        al = []
        for i, t in ((0, x), (1, y)):
            j = b - (nb - (t.ndim - 2))
            if t.ndim > 2 and j >= 0 and t.shape[j] == batch[b]:
                al.append((i, j))
        axes.append(Axis(f"d{b}", batch[b], b, tuple(al)))
    od = nb
    if x.ndim > 1:
        axes.append(Axis("m", m, od, ((0, x.ndim - 2),)))
        od += 1
    if y.ndim > 1:
        axes.append(Axis("n", n, od, ((1, y.ndim - 1),)))
    if decl.combine:
        axes.append(Axis("k", k, None, ((0, x.ndim - 1), (1, max(y.ndim - 2, 0)))))

    def task(r: Ranges, partial: bool) -> Task:
        bt = tuple(rng(r, f"d{b}", batch[b]) for b in range(nb))
        kr = rng(r, "k", k)
        xr = (*bcast_region(bt, x.shape[:-2]), rng(r, "m", m), kr) if x.ndim > 1 else (kr,)
        yr = (*bcast_region(bt, y.shape[:-2]), kr, rng(r, "n", n)) if y.ndim > 1 else (kr,)
        return Task("matmul", node.attrs, ((0, xr), (1, yr)))

    return Space(tuple(axes), task, combine=decl.combine)


# --- reductions --------------------------------------------------------------------------------


def _combinable(combine: str | None, dtype: dt.DType) -> str | None:
    # maximum/minimum/add/mul take numbers, not bools: a bool max is split only along kept axes.
    return combine if combine and dtype.kind != "bool" else None


def _reduce(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space | None:
    x, a = ins[0], node.attrs
    red = normalise_axes(a["axes"], x.ndim)
    if any(x.shape[i] == 0 for i in red):
        return None  # an empty reduction is a constant; keep it whole
    kept = [i for i in range(x.ndim) if i not in red]
    out_dim = {i: (i if a["keepdims"] else kept.index(i)) for i in kept}
    axes = [Axis(f"d{out_dim[i]}", x.shape[i], out_dim[i], ((0, i),)) for i in kept]
    combine = _combinable(decl.combine, x.dtype)
    if combine:
        axes += [Axis(f"r{i}", x.shape[i], None, ((0, i),)) for i in red]
    name = {i: f"d{out_dim[i]}" for i in kept} | {i: f"r{i}" for i in red}

    def task(r: Ranges, partial: bool) -> Task:
        xr = tuple(rng(r, name[i], x.shape[i]) for i in range(x.ndim))
        op = "sum" if partial and node.op == "mean" else node.op
        return Task(op, a, ((0, xr),))

    count = 1
    for i in red:
        count *= x.shape[i]
    finish = _divide_by(count) if node.op == "mean" else None
    return Space(tuple(axes), task, combine=combine, finish=finish)


def _fused(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space | None:
    """An elementwise program splits as elementwise ops do; one ending in a reduction
    splits as that reduction over the program's body (kept axes cut the output, reduced
    axes make partial reductions of the body's regions, merged by the reduction's
    combine), each input read over the region of the body it broadcasts to."""
    epilogue = reduce_step(node.attrs)
    if epilogue is None:
        return _elementwise(node, ins, decl)
    op, ra = epilogue
    body = body_type(ins, node.attrs).shape
    n = len(body)
    red = normalise_axes(ra["axes"], n)
    if any(body[i] == 0 for i in red):
        return None  # an empty reduction is a constant; keep it whole
    kept = [i for i in range(n) if i not in red]
    out_dim = {i: (i if ra["keepdims"] else kept.index(i)) for i in kept}
    axes = [Axis(f"d{out_dim[i]}", body[i], out_dim[i], bcast_aligns(i, n, ins, body)) for i in kept]
    combine = _combinable(optable.get(op).split.combine, node.type.dtype)  # type: ignore[union-attr]
    if combine:
        axes += [Axis(f"r{i}", body[i], None, bcast_aligns(i, n, ins, body)) for i in red]
    name = {i: f"d{out_dim[i]}" for i in kept} | {i: f"r{i}" for i in red}
    program = node.attrs["program"]
    summing = {**node.attrs, "program": (*program[:-1], ("sum", *program[-1][1:]))}

    def task(r: Ranges, partial: bool) -> Task:
        reg = tuple(rng(r, name[i], body[i]) for i in range(n))
        attrs = summing if partial and op == "mean" else node.attrs
        return Task("fused", attrs, tuple((i, bcast_region(reg, t.shape)) for i, t in enumerate(ins)))

    count = 1
    for i in red:
        count *= body[i]
    return Space(tuple(axes), task, combine=combine, finish=_divide_by(count) if op == "mean" else None)


def _argreduce(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space | None:
    x, a = ins[0], node.attrs
    if a["axis"] is None:
        return None
    ax = normalise_axis(a["axis"], x.ndim)
    kept = [i for i in range(x.ndim) if i != ax]
    out_dim = {i: (i if a["keepdims"] else kept.index(i)) for i in kept}

    def task(r: Ranges, partial: bool) -> Task:
        xr = tuple((0, x.shape[i]) if i == ax else rng(r, f"d{out_dim[i]}", x.shape[i])
                   for i in range(x.ndim))
        return Task(node.op, a, ((0, xr),))

    return Space(tuple(Axis(f"d{out_dim[i]}", x.shape[i], out_dim[i], ((0, i),)) for i in kept), task)


# --- nn --------------------------------------------------------------------------------------


def _rows(node: Node, x: TensorType, whole: set[int], extra: Sequence[TensorType] = ()) -> Space:
    """Cut every dim of ``x`` (= the output's) except ``whole``; ``extra`` inputs whole."""
    dims = [d for d in range(x.ndim) if d not in whole]

    def task(r: Ranges, partial: bool) -> Task:
        xr = tuple((0, n) if d in whole else rng(r, f"d{d}", n) for d, n in enumerate(x.shape))
        whole_extra = tuple((i + 1, full_region(t.shape)) for i, t in enumerate(extra))
        return Task(node.op, node.attrs, ((0, xr), *whole_extra))

    return Space(dim_axes(x.shape, lambda d: ((0, d),), dims), task)


def _softmax(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x = ins[0]
    return _rows(node, x, {normalise_axis(node.attrs["axis"], x.ndim)})


def _layer_norm(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x = ins[0]
    return _rows(node, x, set(range(x.ndim - node.attrs["normalized_ndim"], x.ndim)), ins[1:])


def _conv2d(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x, w = ins
    axes = [Axis("d0", x.shape[0], 0, ((0, 0),))]
    if node.attrs["groups"] == 1:  # with groups, an output channel reads only its group
        axes.append(Axis("d1", w.shape[0], 1, ((1, 0),)))

    def task(r: Ranges, partial: bool) -> Task:
        xr = (rng(r, "d0", x.shape[0]), *full_region(x.shape[1:]))
        wr = (rng(r, "d1", w.shape[0]), *full_region(w.shape[1:]))
        return Task("conv2d", node.attrs, ((0, xr), (1, wr)))

    return Space(tuple(axes), task)


def _pool(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x = ins[0]
    return _rows(node, x, {2, 3})


def _embedding(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    w, idx = ins
    k = idx.ndim
    axes = [Axis(f"d{j}", idx.shape[j], j, ((1, j),)) for j in range(k)]
    axes.append(Axis(f"d{k}", w.shape[1], k, ((0, 1),)))

    def task(r: Ranges, partial: bool) -> Task:
        wr = ((0, w.shape[0]), rng(r, f"d{k}", w.shape[1]))
        return Task("embedding", node.attrs, ((0, wr), (1, out_reg(r, idx.shape))))

    return Space(tuple(axes), task)


def _one_hot(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    idx = ins[0]

    def task(r: Ranges, partial: bool) -> Task:
        return Task("one_hot", node.attrs, ((0, out_reg(r, idx.shape)),))

    return Space(dim_axes(idx.shape, lambda d: ((0, d),)), task)


def _cross_entropy(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space | None:
    logits, labels = ins
    a = node.attrs
    if logits.ndim == 1:
        return None
    reduction = a["reduction"]
    if reduction == "mean" and a["ignore_index"] is not None:
        return None  # the count of labels kept depends on the data: not known per tile
    ls = labels.shape
    ldim = [0 if j == 0 else j + 1 for j in range(len(ls))]  # label dim -> logits dim
    if reduction == "none":
        axes = tuple(Axis(f"d{j}", ls[j], j, ((0, ldim[j]), (1, j))) for j in range(len(ls)))
    else:
        axes = tuple(Axis(f"d{j}", ls[j], None, ((0, ldim[j]), (1, j))) for j in range(len(ls)))

    def task(r: Ranges, partial: bool) -> Task:
        lr = out_reg(r, ls)
        xr = (lr[0], (0, logits.shape[1]), *lr[1:])
        attrs = {**a, "reduction": "sum"} if partial else a
        return Task("cross_entropy", attrs, ((0, xr), (1, lr)))

    size = 1
    for s in ls:
        size *= s
    combine = decl.combine if reduction != "none" else None
    finish = _divide_by(size) if reduction == "mean" else None
    return Space(axes, task, combine=combine, finish=finish)


def _mse_loss(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x, y = ins
    shape = broadcast_shapes(x.shape, y.shape)
    n = len(shape)
    reduction = node.attrs["reduction"]
    out_dims = reduction == "none"
    axes = tuple(Axis(f"d{d}", shape[d], d if out_dims else None, bcast_aligns(d, n, ins, shape))
                 for d in range(n))

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, shape)
        attrs = {**node.attrs, "reduction": "sum"} if partial else node.attrs
        return Task("mse_loss", attrs, ((0, bcast_region(reg, x.shape)), (1, bcast_region(reg, y.shape))))

    size = 1
    for s in shape:
        size *= s
    return Space(axes, task, combine=None if out_dims else decl.combine,
                 finish=_divide_by(size) if reduction == "mean" else None)


def _batch_norm(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x = ins[0]
    # In training the statistics span every axis but the channels: only channels are cut.
    dims = [1] if node.attrs["training"] else list(range(x.ndim))

    def aligns(d: int) -> tuple[tuple[int, int], ...]:
        return ((0, d), (1, 0), (2, 0), (3, 0), (4, 0)) if d == 1 else ((0, d),)

    def task(r: Ranges, partial: bool) -> Task:
        xr = out_reg(r, x.shape)
        return Task("batch_norm", node.attrs, ((0, xr), *((i, (xr[1],)) for i in range(1, 5))))

    return Space(dim_axes(x.shape, aligns, dims), task)


RULES: dict[str, Rule] = {
    **SHAPE_RULES,
    "elementwise": _elementwise,
    "dropout": _dropout,
    "input": _input,
    "full": _full,
    "eye": _eye,
    "random": _random,
    "matmul": _matmul,
    "reduce": _reduce,
    "fused": _fused,
    "argreduce": _argreduce,
    "softmax": _softmax,
    "layer_norm": _layer_norm,
    "conv2d": _conv2d,
    "pool": _pool,
    "embedding": _embedding,
    "one_hot": _one_hot,
    "cross_entropy": _cross_entropy,
    "mse_loss": _mse_loss,
    "batch_norm": _batch_norm,
}
