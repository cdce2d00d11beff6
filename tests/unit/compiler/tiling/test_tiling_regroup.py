"""Regroups: when a consumer wants a tensor cut another way than its producer cut it,
the pass moves only the region each tile needs (slices of the overlapping tiles, joined
by the fewest concats), and nothing at all when the cuts line up."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.tiling import TileGrid, TileSizes, tile_graph


def _wa(m: int = 5, k: int = 9, n: int = 8) -> Graph:
    """y = w @ a with a = neg(x): a is an op of its own, so it has its own tiles."""
    b = Builder()
    w = b.add_node("input", [], {"tensor": "w", "shape": (m, k), "dtype": "float64"}, node_id="w")
    x = b.add_node("input", [], {"tensor": "x", "shape": (k, n), "dtype": "float64"}, node_id="x")
    a = b.add_node("neg", [x], {}, node_id="a")
    b.add_node("matmul", [w, a], {}, node_id="y")
    return validate(b.graph(["y"]))


def _ops(tiled: Any) -> Counter[str]:
    """Op counts of the tile graph, with slices and concats counted only when they regroup
    tiles (slices of an uploaded input are how its tiles are made: role 'source')."""
    return Counter(n.op for t, n in tiled.graph.nodes.items()
                   if n.op not in ("slice", "concat") or tiled.roles[t] == "regroup")


def _check(g: Graph, tiled: Any, run: Any, rng: np.random.Generator, seed: int) -> None:
    data = {"w": rng.normal(size=g["w"].shape), "x": rng.normal(size=g["x"].shape)}
    np.testing.assert_allclose(tiled.assemble("y", run(tiled.graph, data)), run(g, data)["y"],
                               rtol=1e-12, atol=1e-12, err_msg=f"seed {seed}")


def test_row_tiles_wanted_as_column_strips(rng: np.random.Generator, seed: int, run: Any) -> None:
    # a is made in 3 row tiles (K = 9 -> 3 x 3); the matmul wants 2 column strips of a
    # (N = 8 -> 4 + 4) with K whole: each strip is 3 slices joined by 1 concat.
    g = _wa()
    tiled = tile_graph(g, TileSizes(explicit={"a": {"d0": 3}, "y": {"n": 4}}))
    ops = _ops(tiled)
    assert (ops["slice"], ops["concat"]) == (6, 2), ops
    assert tiled.grids["y"].counts == (1, 2)
    _check(g, tiled, run, rng, seed)


def test_aligned_cuts_are_adopted_and_move_nothing(rng: np.random.Generator, seed: int, run: Any) -> None:
    # Left to itself, the matmul adopts a's row cut as its K cut: partial products summed
    # by adds, and no slice or concat at all.
    g = _wa()
    tiled = tile_graph(g, TileSizes(explicit={"a": {"d0": 3}}))
    ops = _ops(tiled)
    assert ops["slice"] == 0 and ops["concat"] == 0, ops
    assert ops["matmul"] == 3 and ops["add"] == 2, ops
    _check(g, tiled, run, rng, seed)


def test_a_region_inside_one_tile_is_one_slice(rng: np.random.Generator, run: Any) -> None:
    b = Builder()
    x = b.add_node("input", [], {"tensor": "x", "shape": (9, 4), "dtype": "float64"}, node_id="x")
    a = b.add_node("neg", [x], {}, node_id="a")
    b.add_node("exp", [a], {}, node_id="y")
    g = validate(b.graph(["y"]))
    # a: rows [0, 6) and [6, 9); y: [0, 3), [3, 6) (slices of a's first tile), [6, 9) (its second, as is)
    tiled = tile_graph(g, TileSizes(explicit={"a": {"d0": 6}, "y": {"d0": 3}}))
    ops = _ops(tiled)
    assert (ops["slice"], ops["concat"]) == (2, 0), ops
    data = {"x": rng.normal(size=(9, 4))}
    np.testing.assert_array_equal(tiled.assemble("y", run(tiled.graph, data)), run(g, data)["y"])


def test_a_two_dimensional_regroup_uses_the_fewest_concats() -> None:
    # a is cut 3 x 2 (rows x cols) and y (no split rule) reads it whole: nesting the
    # concats with the 2-piece dim outermost needs 1 + 2 = 3 of them (not 1 + 3 = 4).
    b = Builder()
    x = b.add_node("input", [], {"tensor": "x", "shape": (9, 8), "dtype": "float64"}, node_id="x")
    a = b.add_node("neg", [x], {}, node_id="a")
    b.add_node("unslice", [a], {"shape": (9, 9), "starts": (0, 0), "stops": (9, 8), "steps": (1, 1)},
               node_id="y")
    g = validate(b.graph(["y"]))
    tiled = tile_graph(g, TileSizes(explicit={"a": {"d0": 3, "d1": 4}}))
    ops = _ops(tiled)
    assert ops["concat"] == 3 and ops["slice"] == 0, ops


def test_grid_overlap_and_assemble() -> None:
    grid = TileGrid((7, 5), "float64", ((0, 3, 7), (0, 2, 5)), {})
    assert grid.counts == (2, 2) and len(grid) == 4
    assert grid.overlap(((2, 4), (0, 2))) == [[(0, 2, 3), (1, 3, 4)], [(0, 0, 2)]]
    assert grid.overlap(((3, 3), (1, 1))) == [[(1, 3, 3)], [(0, 1, 1)]]
    whole = np.arange(35.0).reshape(7, 5)
    tiles = {c: f"t{c}" for c in grid.cells()}
    grid = TileGrid(grid.shape, grid.dtype, grid.bounds, tiles)
    values = {tiles[c]: whole[tuple(slice(lo, hi) for lo, hi in grid.region(c))] for c in grid.cells()}
    np.testing.assert_array_equal(grid.assemble(values), whole)


def _wx() -> Graph:
    """y = w @ x, x an input."""
    b = Builder()
    w = b.add_node("input", [], {"tensor": "w", "shape": (5, 9), "dtype": "float64"}, node_id="w")
    x = b.add_node("input", [], {"tensor": "x", "shape": (9, 8), "dtype": "float64"}, node_id="x")
    b.add_node("matmul", [w, x], {}, node_id="y")
    return validate(b.graph(["y"]))


def _sources(tiled: Any, nid: str) -> set[Any]:
    """The regions of input ``nid`` that tasks read (its region tiles)."""
    return {reg for reg, t in tiled.pieces[nid] if t != nid and tiled.roles[t] == "source"}


def test_an_input_held_in_tiles_is_read_from_exactly_those_tiles(
        rng: np.random.Generator, seed: int, run: Any) -> None:
    # x is held in 3 row tiles (a tiled ref): the matmul wants 2 column strips of x with K
    # whole; each strip is made of slices of x's row tiles -- the only regions of x read
    # are those tiles (an executor holds each), never another cut of x nor x whole.
    g = _wx()
    held = ((0, 3, 6, 9), (0, 8))
    tiled = tile_graph(g, TileSizes(explicit={"y": {"n": 4}}, held={"x": held}))
    rows = {((0, 3), (0, 8)), ((3, 6), (0, 8)), ((6, 9), (0, 8))}
    assert _sources(tiled, "x") == rows
    ops = _ops(tiled)
    assert (ops["slice"], ops["concat"]) == (6, 2), ops
    _check(g, tiled, run, rng, seed)
    # left to itself, the matmul adopts the held row cut as its K cut: nothing regrouped
    tiled = tile_graph(g, TileSizes(explicit={}, held={"x": held}, unsplit_bytes=0, min_tasks=3,
                                    max_task_bytes=8 * 8 * 9 * 2))
    ops = _ops(tiled)
    assert ops["slice"] == 0 and ops["concat"] == 0, ops
    assert _sources(tiled, "x") == rows
    _check(g, tiled, run, rng, seed)
