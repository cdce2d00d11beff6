"""What a split rule answers: the axes a node may be cut along (:class:`Axis`), the tile
op for one range per axis (:class:`Task`), both in a :class:`Space`; and the helpers
the rules share. The rules themselves are in :mod:`.rules` and :mod:`.shape_rules` (the
module doc of :mod:`.rules` explains the terms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triplane.proto.builder import Builder, Ref
from triplane.proto.ir import Node, TensorType
from triplane.proto.opdef import SplitDecl
from triplane.scheduler.compiler.tiling.grid import Region, full_region

__all__ = [
    "Axis", "Ranges", "Rule", "Space", "Task", "bcast_aligns", "bcast_region", "dim_axes", "out_reg", "rng",
]

Ranges = Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class Axis:
    """One axis a node may be cut along (see the module doc)."""

    name: str
    length: int
    out_dim: int | None = None
    aligns: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Task:
    """One tile op: ``inputs`` are ``(input index, region)`` in the tile op's input order
    (an input may be skipped, as concat skips inputs outside its range)."""

    op: str
    attrs: Mapping[str, Any]
    inputs: tuple[tuple[int, Region], ...] = ()


@dataclass(frozen=True)
class Space:
    axes: tuple[Axis, ...]
    task: Callable[[Ranges, bool], Task]
    combine: str | None = None
    finish: Callable[[Builder, Ref], Ref] | None = None
    makes_regions: bool = False

    def out_region(self, ranges: Ranges, shape: Sequence[int]) -> Region:
        """The output region a task with these ranges makes (uncut dims whole)."""
        reg = list(full_region(shape))
        for ax in self.axes:
            if ax.out_dim is not None and ax.name in ranges:
                reg[ax.out_dim] = ranges[ax.name]
        return tuple(reg)


Rule = Callable[[Node, Sequence[TensorType], SplitDecl], "Space | None"]


def rng(r: Ranges, name: str, length: int) -> tuple[int, int]:
    return r.get(name, (0, length))


def bcast_region(out: Region, shape: Sequence[int]) -> Region:
    """The region of an operand of ``shape`` that broadcasts to the output region ``out``:
    a size-1 (broadcast) dim is read whole, missing leading dims are dropped."""
    lead = len(out) - len(shape)
    return tuple((0, s) if s == 1 else out[lead + j] for j, s in enumerate(shape))


def bcast_aligns(d: int, n: int, ins: Sequence[TensorType], out: Sequence[int],
                  which: Sequence[int] | None = None) -> tuple[tuple[int, int], ...]:
    out_al = []
    for i, t in enumerate(ins):
        if which is not None and i not in which:
            continue
        j = d - (n - len(t.shape))
        if j >= 0 and t.shape[j] == out[d]:
            out_al.append((i, j))
    return tuple(out_al)


def dim_axes(shape: Sequence[int], aligns: Callable[[int], tuple[tuple[int, int], ...]],
              dims: Sequence[int] | None = None) -> tuple[Axis, ...]:
    dims = range(len(shape)) if dims is None else dims
    return tuple(Axis(f"d{d}", shape[d], d, aligns(d)) for d in dims)


def out_reg(r: Ranges, shape: Sequence[int]) -> Region:
    return tuple(rng(r, f"d{d}", n) for d, n in enumerate(shape))
