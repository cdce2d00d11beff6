"""Explain: the dict and the text say, per task, its node and its predicted (and actual)
times, and per tensor its tiles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import CostModel, NodeFigures, format_seconds
from triplane.scheduler.compiler.explain import explain, grid_tiles, render_text
from triplane.scheduler.compiler.placement import Placement, place


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


NODES = [NodeFigures(f"n{i}", gflops=1.0, gbps=1.0, memory_capacity=2**30, bandwidth_gbps=1.0,
                     latency_us=0.0) for i in range(2)]


def placed() -> tuple[Graph, Placement]:
    b = Builder()
    x = b.op("input", tensor="x", shape=(100, 100), dtype="float32")
    m1 = b.op("matmul", x, x)
    m2 = b.op("matmul", b.op("uniform", shape=(100, 100), seed=4), x)
    g = b.graph([b.op("add", m1, m2)])
    return g, place(g, NODES, model=CostModel(task_overhead_s=0.0))


def test_the_dict_has_every_task_with_its_node_and_predicted_times() -> None:
    g, p = placed()
    doc = explain(g, p, nodes=NODES)
    assert doc["version"] == 1
    assert {t["task"] for t in doc["tasks"]} == set(p.tasks)
    for t in doc["tasks"]:
        tp = p.tasks[t["task"]]
        assert t["node"] == tp.node and t["op"] == tp.op
        assert t["predicted"] == {"start_s": tp.start, "finish_s": tp.finish,
                                  "compute_s": tp.compute_s, "comm_s": tp.comm_s}
        assert t["actual"] is None and t["ratio"] is None
    assert doc["makespan"] == {"predicted_s": p.makespan, "actual_s": None, "ratio": None}
    assert {n["node"]: n["peak_memory_bytes"] for n in doc["nodes"]} == dict(p.peak_memory)
    assert sum(n["tasks"] for n in doc["nodes"]) == len(p.tasks)
    assert all(n["memory_free_bytes"] == 2**30 for n in doc["nodes"])
    # untiled: one whole tile per tensor, on the node that made it (inputs on the scheduler)
    by_name = {t["tensor"]: t for t in doc["tensors"]}
    assert set(by_name) == set(g.nodes)
    for name, t in by_name.items():
        assert t["grid"] == [1, 1] and len(t["tiles"]) == 1
        want = p.node_of(name) if name in p.tasks else "scheduler"
        assert t["tiles"][0]["node"] == want


def test_the_dict_round_trips_through_json() -> None:
    g, p = placed()
    doc = explain(g, p, nodes=NODES, actual={t: (100.0 + i, 101.5 + i) for i, t in enumerate(p.tasks)})
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text) == doc


def test_actual_times_sit_beside_predicted_with_the_ratio(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g, p = placed()
    t0 = 1.7e9  # a unix clock: shifted so the first actual start is 0
    actual = {}
    for tid, tp in p.tasks.items():
        slow = float(rng.uniform(0.5, 3.0))
        actual[tid] = (t0 + tp.start * slow, t0 + tp.start * slow + (tp.compute_s + tp.comm_s) * slow)
    doc = explain(g, p, actual=actual)
    first = min(s for s, _ in actual.values())
    for t in doc["tasks"]:
        s, e = actual[t["task"]]
        assert t["actual"]["start_s"] == pytest.approx(s - first, abs=1e-6), f"seed {seed}"
        assert t["actual"]["duration_s"] == pytest.approx(e - s, rel=1e-6)
        want = (e - s) / (t["predicted"]["compute_s"] + t["predicted"]["comm_s"])
        assert t["ratio"] == pytest.approx(want, rel=1e-6), f"seed {seed}"
    ms = doc["makespan"]
    assert ms["actual_s"] == pytest.approx(max(e for _, e in actual.values()) - first, abs=1e-6)
    assert ms["ratio"] == pytest.approx(ms["actual_s"] / p.makespan, rel=1e-9)


def test_the_text_names_each_task_its_node_and_times() -> None:
    g, p = placed()
    text = render_text(explain(g, p, nodes=NODES), width=200)
    assert "predicted makespan " + format_seconds(p.makespan) in text
    lines = text.splitlines()
    for tid, tp in p.tasks.items():
        row = next((ln for ln in lines if ln.startswith(f"│ {tid} ")), None)
        assert row is not None, f"no row for task {tid}:\n{text}"
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[1] == tp.op and cells[3] == tp.node
        assert cells[4:8] == [format_seconds(v) for v in (tp.start, tp.finish, tp.compute_s, tp.comm_s)]
        assert cells[-1] == (", ".join(g.nodes[tid].inputs) or "—")  # untiled: reads by id
    assert "actual" not in text  # no actual times given: no actual columns


def test_the_text_shows_actual_columns_and_ratio_when_given() -> None:
    g, p = placed()
    actual = {t: (tp.start, tp.start + 2 * (tp.compute_s + tp.comm_s)) for t, tp in p.tasks.items()}
    text = render_text(explain(g, p, actual=actual), width=220)
    assert "actual start" in text and "2.00x" in text


def test_max_tasks_limits_rows_and_counts_the_rest() -> None:
    b = Builder()
    g = b.graph([b.op("uniform", shape=(8,), seed=i) for i in range(30)])
    p = place(g, NODES)
    text = render_text(explain(g, p), max_tasks=10)
    assert "and 20 more tasks" in text


def test_tiles_from_the_tiler_list_each_tile_and_its_node() -> None:
    b = Builder()
    parts = [[b.op("uniform", shape=(50, 50), seed=2 * i + j) for j in range(2)] for i in range(2)]
    g = b.graph([r for row in parts for r in row])
    p = place(g, NODES, model=CostModel(task_overhead_s=0.0))

    class Grid:  # the shape of the tiling pass's grid: ids in a nested row-major list
        shape, dtype = (100, 100), "float32"
        tiles = [[r.id for r in row] for row in parts]

    doc = explain(g, p, tiles={"A": Grid()}, origin={r.id: "A" for row in parts for r in row})
    (a,) = doc["tensors"]
    assert a["tensor"] == "A" and a["type"] == "float32[100, 100]" and a["grid"] == [2, 2]
    assert [(t["index"], t["tile"]) for t in a["tiles"]] == [([i, j], parts[i][j].id)
                                                              for i in range(2) for j in range(2)]
    assert all(t["node"] == p.node_of(t["tile"]) and t["type"] == "float32[50, 50]" for t in a["tiles"])
    assert {t["origin"] for t in doc["tasks"]} == {"A"}
    text = render_text(doc, width=200)
    assert "2x2" in text and "(A)" in text


def test_grid_tiles_reads_mappings_lists_and_single_ids() -> None:
    assert grid_tiles({(0, 1): "b", (0, 0): "a"}) == ((1, 2), [((0, 0), "a"), ((0, 1), "b")])
    assert grid_tiles([["a", "b"], ["c", "d"]])[0] == (2, 2)
    assert grid_tiles("whole") == ((), [((), "whole")])
    with pytest.raises(TypeError, match="tile ids"):
        grid_tiles(3.5)


def test_the_tiling_pass_grid_is_read_as_is() -> None:
    grid_mod = pytest.importorskip("triplane.scheduler.compiler.tiling.grid")
    grid = grid_mod.TileGrid((10, 7), "float32", ((0, 5, 10), (0, 4, 7)),
                             {(1, 1): "d", (0, 0): "a", (0, 1): "b", (1, 0): "c"})
    assert grid_tiles(grid) == ((2, 2), [((0, 0), "a"), ((0, 1), "b"), ((1, 0), "c"), ((1, 1), "d")])
