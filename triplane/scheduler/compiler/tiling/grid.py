"""Tile grids: how one tensor is cut into tiles.

A :class:`TileGrid` cuts each dimension at increasing boundaries ``0 = b0 < b1 < ... <
bn = size`` (uneven edges allowed: the last tile of a dimension may be shorter, or any
tile may be), so a tile is the box of one interval per dimension. ``tiles`` maps each
grid cell (one interval index per dimension) to the id of the tile-graph node that holds
it. A dimension of size 0 has the single interval ``(0, 0)``.

A :data:`Region` is a box of a tensor: one ``(start, stop)`` pair per dimension.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Cuts", "Region", "TileGrid", "even_cuts", "full_region", "refine", "region_shape"]

Region = tuple[tuple[int, int], ...]
Cuts = tuple[int, ...]  # the boundaries of one dimension, 0 first and the size last


def full_region(shape: Sequence[int]) -> Region:
    return tuple((0, int(n)) for n in shape)


def region_shape(region: Region) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in region)


def even_cuts(length: int, extent: int) -> Cuts:
    """Boundaries of tiles of ``extent`` along ``length`` (the last one shorter when
    ``extent`` does not divide ``length``)."""
    if extent < 1:
        raise ValueError(f"a tile extent must be >= 1, got {extent}")
    if length <= 0:
        return (0, max(length, 0))
    return (*range(0, length, extent), length)


def refine(cuts: Cuts) -> Cuts:
    """Every interval longer than 1 split at its midpoint: the old boundaries stay, so a
    tile of the refined cut lies inside one tile of the old one (no regroup needed)."""
    out = [cuts[0]]
    for lo, hi in itertools.pairwise(cuts):
        if hi - lo > 1:
            out.append(lo + (hi - lo + 1) // 2)
        out.append(hi)
    return tuple(out)


def check_cuts(cuts: Sequence[int], length: int) -> Cuts:
    c = tuple(int(x) for x in cuts)
    if length == 0 and c == (0, 0):
        return c
    if len(c) < 2 or c[0] != 0 or c[-1] != length or any(a >= b for a, b in itertools.pairwise(c)):
        raise ValueError(f"tile boundaries {list(c)} must increase strictly from 0 to {length}")
    return c


@dataclass(frozen=True)
class TileGrid:
    """One tensor's tiles: ``bounds[d]`` are dimension d's boundaries; ``tiles`` maps a
    cell (interval index per dimension) to its tile node id."""

    shape: tuple[int, ...]
    dtype: str
    bounds: tuple[Cuts, ...]
    tiles: Mapping[tuple[int, ...], str] = field(default_factory=dict)

    @property
    def counts(self) -> tuple[int, ...]:
        """Tiles per dimension (the grid's shape)."""
        return tuple(len(b) - 1 for b in self.bounds)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return self.counts

    def __len__(self) -> int:
        return math.prod(self.counts)

    def cells(self) -> Iterator[tuple[int, ...]]:
        """Every cell, row-major."""
        return itertools.product(*(range(c) for c in self.counts))

    def region(self, cell: Sequence[int]) -> Region:
        return tuple((b[i], b[i + 1]) for b, i in zip(self.bounds, cell))

    def overlap(self, region: Region) -> list[list[tuple[int, int, int]]]:
        """Per dimension, the cells the region touches: ``(interval index, lo, hi)`` with
        ``lo:hi`` the part of the region inside that interval (in tensor coordinates). An
        empty range touches the one interval holding its start."""
        out = []
        for b, (lo, hi) in zip(self.bounds, region):
            if hi <= lo:
                i = min(max(bisect.bisect_right(b, lo) - 1, 0), len(b) - 2)
                out.append([(i, lo, lo)])
                continue
            first = bisect.bisect_right(b, lo) - 1
            last = bisect.bisect_left(b, hi) - 1
            out.append([(i, max(lo, b[i]), min(hi, b[i + 1])) for i in range(first, last + 1)])
        return out

    def assemble(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        """The whole tensor from its tiles' values (what a fetch does, piece by piece)."""
        first = values[self.tiles[next(iter(self.cells()))]]
        out = np.empty(self.shape, dtype=first.dtype)
        for cell in self.cells():
            out[tuple(slice(lo, hi) for lo, hi in self.region(cell))] = values[self.tiles[cell]]
        return out
