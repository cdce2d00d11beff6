"""Split rules of the shape ops: each maps an output tile's region to the input region(s)
holding its elements, so a tile of a reshape/transpose/slice/... reads only what it needs.
(The framework: :mod:`.space`; the other kinds, and the table of all: :mod:`.rules`.)"""

from __future__ import annotations

from collections.abc import Sequence

from triplane.proto.ir import Node, TensorType
from triplane.proto.opdef import SplitDecl, normalise_axes, normalise_axis
from triplane.scheduler.compiler.tiling.grid import Region, region_shape
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
)


def _reshape(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space | None:
    # A dim is preserved when the input has a dim of the same size after the same number of
    # elements (equal prefix products). A box that cuts only preserved dims (every other
    # dim whole) is a box of the input too: the dims between two preserved ones reshape
    # among themselves. Other dims are never cut, so a reshape that preserves nothing is
    # taken whole.
    x = ins[0]
    out = node.shape
    in_at = {}
    p = 1
    for j, s in enumerate(x.shape):
        in_at[(p, s)] = j
        p *= s
    anchors = {}
    p = 1
    for d, s in enumerate(out):
        if s > 1 and (p, s) in in_at:
            anchors[d] = in_at[(p, s)]
        p *= s
    if not anchors:
        return None
    back = {j: d for d, j in anchors.items()}

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        xr = tuple(reg[back[j]] if j in back else (0, s) for j, s in enumerate(x.shape))
        return Task("reshape", {"shape": region_shape(reg)}, ((0, xr),))

    return Space(tuple(Axis(f"d{d}", out[d], d, ((0, j),)) for d, j in anchors.items()), task)


def _transpose(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    perm = node.attrs["perm"]
    out = node.shape

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        xr: list[tuple[int, int]] = [(0, 0)] * len(perm)
        for d, p in enumerate(perm):
            xr[p] = reg[d]
        return Task("transpose", node.attrs, ((0, tuple(xr)),))

    return Space(dim_axes(out, lambda d: ((0, perm[d]),)), task)


def _broadcast_to(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    out, n = node.shape, len(node.shape)

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        return Task("broadcast_to", {"shape": region_shape(reg)}, ((0, bcast_region(reg, ins[0].shape)),))

    return Space(dim_axes(out, lambda d: bcast_aligns(d, n, ins, out)), task)


def _squeeze(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x = ins[0]
    axes = node.attrs["axes"]
    drop = [i for i, s in enumerate(x.shape) if s == 1] if axes is None \
        else list(normalise_axes(axes, x.ndim))
    kept = [i for i in range(x.ndim) if i not in drop]

    def task(r: Ranges, partial: bool) -> Task:
        # Name the dropped axes: a tile may have other size-1 dims that must stay.
        xr = tuple((0, 1) if i in drop else r.get(f"d{kept.index(i)}", (0, x.shape[i]))
                   for i in range(x.ndim))
        return Task("squeeze", {"axes": tuple(drop)}, ((0, xr),))

    return Space(tuple(Axis(f"d{d}", x.shape[i], d, ((0, i),)) for d, i in enumerate(kept)), task)


def _unsqueeze(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    out = node.shape
    new = normalise_axes(node.attrs["axes"], len(out))
    old = [d for d in range(len(out)) if d not in new]  # input dim j is output dim old[j]

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        return Task("unsqueeze", node.attrs, ((0, tuple(reg[d] for d in old)),))

    return Space(tuple(Axis(f"d{d}", out[d], d, ((0, j),)) for j, d in enumerate(old)), task)


def _slice(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    a = node.attrs
    out = node.shape
    starts, steps = a["starts"], a["steps"]

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        xr = tuple((s + lo * st, s + (hi - 1) * st + 1) if hi > lo else (s, s)
                   for (lo, hi), s, st in zip(reg, starts, steps))
        return Task("slice", {"starts": (0,) * len(out), "stops": region_shape(xr), "steps": steps},
                    ((0, xr),))

    def aligns(d: int) -> tuple[tuple[int, int], ...]:
        return ((0, d),) if starts[d] == 0 and steps[d] == 1 else ()

    return Space(dim_axes(out, aligns), task)


def _concat(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    out = node.shape
    ax = normalise_axis(node.attrs["axis"], len(out))
    offsets = [0]
    for t in ins:
        offsets.append(offsets[-1] + t.shape[ax])

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        lo, hi = reg[ax]
        parts: list[tuple[int, Region]] = []
        for i in range(len(ins)):
            a, b = max(lo, offsets[i]), min(hi, offsets[i + 1])
            if a < b:
                parts.append((i, tuple((a - offsets[i], b - offsets[i]) if d == ax else rg
                                       for d, rg in enumerate(reg))))
        if not parts:  # an empty range: an empty piece of the first input
            parts.append((0, tuple((0, 0) if d == ax else rg for d, rg in enumerate(reg))))
        return Task("concat", node.attrs, tuple(parts))

    def aligns(d: int) -> tuple[tuple[int, int], ...]:
        return () if d == ax else tuple((i, d) for i in range(len(ins)))

    return Space(dim_axes(out, aligns), task)


def _stack(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    out = node.shape
    ax = normalise_axis(node.attrs["axis"], len(out))

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        sub = reg[:ax] + reg[ax + 1:]
        return Task("stack", node.attrs, tuple((i, sub) for i in range(*reg[ax])))

    def aligns(d: int) -> tuple[tuple[int, int], ...]:
        return () if d == ax else tuple((i, d if d < ax else d - 1) for i in range(len(ins)))

    return Space(dim_axes(out, aligns), task)


def _flip(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    out = node.shape
    flipped = set(normalise_axes(node.attrs["axes"], len(out)))

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        xr = tuple((n - hi, n - lo) if d in flipped else (lo, hi)
                   for d, ((lo, hi), n) in enumerate(zip(reg, out)))
        return Task("flip", {"axes": tuple(sorted(flipped))}, ((0, xr),))

    return Space(dim_axes(out, lambda d: () if d in flipped else ((0, d),)), task)


def _pad(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x, a = ins[0], node.attrs
    out = node.shape
    pads = a["pads"]

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        inside = [(max(lo, before), min(hi, before + n))
                  for (lo, hi), (before, _), n in zip(reg, pads, x.shape)]
        if any(stop <= start for start, stop in inside):
            # the tile is all padding: make it directly
            return Task("full", {"value": a["value"], "shape": region_shape(reg), "dtype": node.dtype})
        xr = tuple((c - before, b - before) for (c, b), (before, _) in zip(inside, pads))
        new_pads = tuple((c - lo, hi - b) for (c, b), (lo, hi) in zip(inside, reg))
        return Task("pad", {**a, "pads": new_pads}, ((0, xr),))

    def aligns(d: int) -> tuple[tuple[int, int], ...]:
        return ((0, d),) if pads[d][0] == 0 else ()

    return Space(dim_axes(out, aligns), task)


def _gather(node: Node, ins: Sequence[TensorType], decl: SplitDecl) -> Space:
    x, idx = ins
    ax = normalise_axis(node.attrs["axis"], x.ndim)
    k = idx.ndim
    axes = [Axis(f"d{d}", x.shape[d], d, ((0, d),)) for d in range(ax)]
    axes += [Axis(f"d{ax + j}", idx.shape[j], ax + j, ((1, j),)) for j in range(k)]
    axes += [Axis(f"d{ax + k + d - ax - 1}", x.shape[d], ax + k + d - ax - 1, ((0, d),))
             for d in range(ax + 1, x.ndim)]
    out = node.shape

    def task(r: Ranges, partial: bool) -> Task:
        reg = out_reg(r, out)
        xr = (*reg[:ax], (0, x.shape[ax]), *reg[ax + k:])
        return Task("gather", node.attrs, ((0, xr), (1, reg[ax:ax + k])))

    return Space(tuple(axes), task)


SHAPE_RULES: dict[str, Rule] = {
    "reshape": _reshape,
    "transpose": _transpose,
    "broadcast_to": _broadcast_to,
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "slice": _slice,
    "concat": _concat,
    "stack": _stack,
    "flip": _flip,
    "pad": _pad,
    "gather": _gather,
}
