"""Tile sizes from cluster figures: tiny graphs stay whole; a task always fits one node
(with headroom); tensors larger than any node are cut; a graph beyond the cluster's total
memory is refused at compile time with the tensor and the limit named. (Plans only: the
12288^2 matmul is executed by the cluster tests.)"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from triplane.proto.builder import Builder
from triplane.proto.errors import LimitError
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.costmodel import DEFAULT_OP_SCALE, CostModel
from triplane.scheduler.compiler.tiling import ClusterFigures, TileSizes, plan_sizes, tile_graph
from triplane.scheduler.compiler.tiling.grid import check_cuts, even_cuts, refine

MiB = 1 << 20
THREE_SMALL = ClusterFigures.uniform(3, 768 * MiB)


def _task_bytes(tiled: Any) -> dict[str, int]:
    """Inputs + output bytes of every task (non-input node) of a tile graph."""
    g = tiled.graph
    return {t: n.type.nbytes + sum(g[i].type.nbytes for i in n.inputs)
            for t, n in g.nodes.items() if n.op != "input"}


def _mlp() -> Graph:
    b = Builder()
    x = b.add_node("input", [], {"tensor": "x", "shape": (64, 32), "dtype": "float32"}, node_id="x")
    w = b.add_node("normal", [], {"shape": (32, 16), "seed": 1}, node_id="w")
    h = b.op("relu", b.op("matmul", x, w))
    b.add_node("log_softmax", [h], {"axis": 1}, node_id="y")
    return validate(b.graph(["y"]))


def test_a_tiny_graph_is_not_split(run: Any, rng: np.random.Generator) -> None:
    g = _mlp()
    tiled = tile_graph(g, plan_sizes(THREE_SMALL))
    assert all(grid.counts == (1,) * len(grid.shape) for grid in tiled.grids.values())
    assert len(tiled.graph) == len(g)
    data = {"x": rng.normal(size=(64, 32)).astype(np.float32)}
    np.testing.assert_array_equal(tiled.assemble("y", run(tiled.graph, data)), run(g, data)["y"])


def _big_matmul(n: int = 12288) -> Graph:
    b = Builder()
    a = b.add_node("uniform", [], {"shape": (n, n), "seed": 1}, node_id="a")
    c = b.add_node("normal", [], {"shape": (n, n), "seed": 2}, node_id="c")
    b.add_node("matmul", [a, c], {}, node_id="y")
    return validate(b.graph(["y"]))


def test_12288_matmul_on_three_768_mib_nodes_fits_every_task() -> None:
    g = _big_matmul()
    sizes = plan_sizes(THREE_SMALL)
    assert sizes.max_task_bytes == 384 * MiB and sizes.min_tasks == 6
    t0 = time.perf_counter()
    tiled = tile_graph(g, sizes)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"planning took {elapsed:.2f} s"
    per_task = _task_bytes(tiled)
    assert max(per_task.values()) <= sizes.max_task_bytes, max(per_task.values()) / MiB
    matmuls = [t for t, n in tiled.graph.nodes.items() if n.op == "matmul"]
    assert len(matmuls) >= sizes.min_tasks
    whole = 12288 * 12288 * 4
    assert all(n.type.nbytes < whole for n in tiled.graph.nodes.values())  # nothing whole anywhere
    assert tiled.grids["y"].shape == (12288, 12288)
    # every random input tile is made exactly once (no region is made twice)
    for src in ("a", "c"):
        regions = [r for r, _ in tiled.pieces[src]]
        assert len(regions) == len(set(regions))


def test_a_tensor_larger_than_any_node_is_cut_to_fit() -> None:
    b = Builder()
    u = b.add_node("uniform", [], {"shape": (20000, 12000), "seed": 3}, node_id="u")  # 915 MiB
    b.add_node("sum", [b.op("exp", u)], {"axes": None}, node_id="y")
    g = validate(b.graph(["y"]))
    sizes = plan_sizes(THREE_SMALL)
    tiled = tile_graph(g, sizes)
    assert max(_task_bytes(tiled).values()) <= sizes.max_task_bytes


def test_a_graph_beyond_the_clusters_memory_names_the_tensor_and_the_limit() -> None:
    b = Builder()
    b.add_node("uniform", [], {"shape": (32768, 32768), "seed": 3}, node_id="huge")  # 4 GiB
    g = validate(b.graph(["huge"]))
    with pytest.raises(LimitError, match=r"node 'huge' \(uniform\).*4 GiB.*total memory of 2.25 GiB"):
        tile_graph(g, plan_sizes(THREE_SMALL))


def test_a_peak_beyond_the_clusters_memory_is_refused() -> None:
    b = Builder()  # three 801 MiB tensors live at once: each fits, together they do not
    xs = [b.add_node("normal", [], {"shape": (14000, 15000), "seed": i}, node_id=f"x{i}") for i in range(3)]
    b.add_node("add", [b.op("add", xs[0], xs[1]), xs[2]], {}, node_id="y")
    g = validate(b.graph(["y"]))
    with pytest.raises(LimitError, match=r"total memory of 2\.25 GiB"):
        tile_graph(g, plan_sizes(THREE_SMALL))


def test_an_uncuttable_task_larger_than_a_node_is_refused() -> None:
    b = Builder()  # unslice has no split rule: its 400 MiB input and output go to one task
    x = b.add_node("input", [], {"tensor": "x", "shape": (10000, 10000), "dtype": "float32"}, node_id="x")
    b.add_node("unslice", [x], {"shape": (10001, 10000), "starts": (0, 0), "stops": (10000, 10000),
                                "steps": (1, 1)}, node_id="big")
    g = validate(b.graph(["big"]))
    with pytest.raises(LimitError, match=r"node 'big' \(unslice\).*cannot be cut further.*384 MiB"):
        tile_graph(g, plan_sizes(THREE_SMALL))


def _chain(n: int) -> Graph:
    b = Builder()
    x = b.add_node("uniform", [], {"shape": (n, n), "seed": 1}, node_id="x")
    b.add_node("exp", [x], {}, node_id="y")
    return validate(b.graph(["y"]))


def test_compute_vs_communication_decides_how_far_to_cut_for_parallelism() -> None:
    g = _chain(4096)  # 64 MiB: fits any node whole, so only parallelism could cut it
    quick = ClusterFigures.uniform(3, 768 * MiB, latency_us=50)
    slow = ClusterFigures.uniform(3, 768 * MiB, latency_us=500_000)
    # Enough tasks for every executor; not more than halving once past them pays for
    # (each extra task costs latency and dispatch and moves no fewer bytes).
    assert 3 <= len(tile_graph(g, plan_sizes(quick)).grids["y"]) <= 6
    assert len(tile_graph(g, plan_sizes(slow)).grids["y"]) == 1   # a 0.5 s latency: never worth it


def test_tiling_takes_the_op_calibration_of_the_cost_model_placement_uses() -> None:
    b = Builder()
    b.add_node("normal", [], {"shape": (2048, 2048), "seed": 1}, node_id="y")
    g = validate(b.graph(["y"]))
    figs = ClusterFigures.uniform(3, 768 * MiB, latency_us=50)
    # Random numbers cost far more than their bytes (DEFAULT_OP_SCALE): cut for every
    # executor. A model that calls them as cheap as a copy cuts them less.
    calibrated = plan_sizes(figs, model=CostModel())
    assert calibrated.op_scale == DEFAULT_OP_SCALE
    assert len(tile_graph(g, calibrated).grids["y"]) > 3
    uncalibrated = plan_sizes(figs, model=CostModel(op_scale={}, task_overhead_s=1e-3))
    assert uncalibrated.task_overhead_s == 1e-3
    assert len(tile_graph(g, uncalibrated).grids["y"]) < len(tile_graph(g, calibrated).grids["y"])


def test_figures_from_placements_node_records() -> None:
    nodes = [SimpleNamespace(name=f"n{i}", gflops=40.0 + i, gbps=8.0, memory_capacity=(1 + i) * 512 * MiB,
                             memory_free=400 * MiB, bandwidth_gbps=2.0 - i / 2, latency_us=100.0 * (i + 1))
             for i in range(2)]
    fig = ClusterFigures.from_nodes(nodes)
    assert fig.bandwidth_gbps == 1.5 and fig.latency_us == 200.0
    sizes = plan_sizes(fig)
    assert sizes.max_task_bytes == 200 * MiB and sizes.total_bytes == 800 * MiB and sizes.gflops == 40.0


def test_explicit_cuts_name_real_axes() -> None:
    g = _mlp()
    with pytest.raises(ValueError, match=r"no split axis 'k'.*d0"):
        tile_graph(g, TileSizes(explicit={"y": {"k": 2}}))


def test_cut_helpers() -> None:
    assert even_cuts(10, 4) == (0, 4, 8, 10)
    assert even_cuts(0, 3) == (0, 0)
    assert refine((0, 4, 8, 10)) == (0, 2, 4, 6, 8, 9, 10)
    assert refine((0, 1)) == (0, 1)
    assert check_cuts((0, 3, 7), 7) == (0, 3, 7)
    with pytest.raises(ValueError):
        check_cuts((0, 3, 3, 7), 7)
    with pytest.raises(ValueError):
        plan_sizes(THREE_SMALL, headroom=0)
    sizes = TileSizes()
    assert tile_graph(_chain(8), sizes).grids["y"].counts == (1, 1)
