"""Random ops made a tile at a time equal the whole tensor's region, bit for bit: the
kernels (full_shape/start attributes) and the tiling pass (tiles, on-demand regions)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from triplane.engines.op.numpy_engine import NumpyEngine
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.builder import Builder
from triplane.proto.errors import AttrError, ShapeError
from triplane.proto.ir import TensorType
from triplane.proto.validate import validate
from triplane.scheduler.compiler.tiling import TileSizes, tile_graph

ENGINE = NumpyEngine()


def _make(op: str, **attrs: Any) -> np.ndarray:
    a = optable.get(op).normalise_attrs(attrs)
    t = optable.get(op).check([], a)
    return ENGINE.run(op, [], a, t)


Box = tuple[tuple[int, ...], tuple[int, ...]]  # (start, size)


def _boxes(rng: np.random.Generator, shape: tuple[int, ...], n: int) -> list[Box]:
    out = []
    for _ in range(n):
        start = tuple(int(rng.integers(0, s)) for s in shape)
        size = tuple(int(rng.integers(1, s - st + 1)) for s, st in zip(shape, start))
        out.append((start, size))
    out.append(((2, 0, 0), (1, shape[1], shape[2])))          # contiguous: one whole row block
    out.append(((0, 0, 0), shape))                             # the whole, as a region
    return out


@pytest.mark.parametrize("op,dtype", [("uniform", "float64"), ("normal", "float64"), ("normal", "float32"),
                                      ("uniform", "float16")])
def test_random_region_equals_the_whole_tensors_region(op: str, dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (6, 9, 7)
    whole = _make(op, shape=shape, seed=seed, dtype=dtype, offset=3)
    for start, size in _boxes(rng, shape, 12):
        tile = _make(op, shape=size, seed=seed, dtype=dtype, offset=3, full_shape=shape, start=start)
        want = whole[tuple(slice(s, s + n) for s, n in zip(start, size))]
        np.testing.assert_array_equal(tile, want, err_msg=f"{op} {dtype} box {start}+{size} (seed {seed})")


def test_dropout_region_uses_the_whole_mask(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(6, 9, 7))
    attrs = optable.get("dropout").normalise_attrs({"p": 0.4, "seed": seed})
    whole = ENGINE.run("dropout", [x], attrs, TensorType(x.shape, dt.float64))
    for start, size in _boxes(rng, x.shape, 12):
        box = tuple(slice(s, s + n) for s, n in zip(start, size))
        a = attrs.replace(full_shape=x.shape, start=start)
        tile = ENGINE.run("dropout", [x[box]], a, TensorType(size, dt.float64))
        np.testing.assert_array_equal(tile, whole[box], err_msg=f"box {start}+{size} (seed {seed})")


@pytest.mark.parametrize("attrs,error,text", [
    ({"full_shape": (4, 4)}, AttrError, "go together"),
    ({"full_shape": (4, 4), "start": (0, 2)}, ShapeError, "does not fit"),
    ({"full_shape": (4,), "start": (0,)}, ShapeError, "does not fit"),
])
def test_bad_region_attributes_are_rejected(attrs: dict[str, Any], error: type, text: str) -> None:
    b = Builder()
    with pytest.raises(error, match=text):
        b.op("uniform", shape=(2, 3), seed=1, **attrs)


def test_a_tiled_random_tensor_equals_the_untiled_one(seed: int, run: Any) -> None:
    b = Builder()
    b.add_node("normal", [], {"shape": (13, 11), "seed": seed, "dtype": "float32"}, node_id="r")
    g = validate(b.graph(["r"]))
    want = run(g, {})["r"]
    tiled = tile_graph(g, TileSizes(explicit={"r": {"d0": 5, "d1": (2, 9)}}))  # uneven both ways
    assert tiled.grids["r"].counts == (3, 3)
    np.testing.assert_array_equal(tiled.assemble("r", run(tiled.graph, {})), want, err_msg=f"seed {seed}")


def test_random_sources_are_made_where_consumers_need_them(seed: int, run: Any) -> None:
    # u is cut three ways by its consumers (matmul rows, a transpose's columns): each
    # region is made directly from the seed -- no slice, no concat -- and still equals
    # the untiled graph.
    b = Builder()
    u = b.add_node("uniform", [], {"shape": (12, 10), "seed": seed, "dtype": "float64"}, node_id="u")
    w = b.add_node("normal", [], {"shape": (10, 6), "seed": seed + 1, "dtype": "float64"}, node_id="w")
    y = b.add_node("matmul", [u, w], {}, node_id="y")
    t = b.add_node("transpose", [u], {"perm": (1, 0)}, node_id="t")
    g = validate(b.graph([y, t]))
    want = run(g, {})
    tiled = tile_graph(g, TileSizes(explicit={"y": {"m": 5, "k": 4}, "t": {"d1": 7}}))
    ops = [n.op for n in tiled.graph.nodes.values()]
    assert ops.count("slice") == 0 and ops.count("concat") == 0
    regions = {r for r, _ in tiled.pieces["u"]}
    assert len(regions) == 3 * 3 + 2, regions  # 3 row blocks x 3 K blocks for y, 2 for t
    got = run(tiled.graph, {})
    np.testing.assert_allclose(tiled.assemble("y", got), want["y"], rtol=1e-12, atol=1e-12,
                               err_msg=f"seed {seed}")
    np.testing.assert_array_equal(tiled.assemble("t", got), want["t"], err_msg=f"seed {seed}")
