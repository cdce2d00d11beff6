"""Explain on a tiled plan: each task lists what it reads (which tile, of which tensor, which
box of it, where it lives), and inputs read in regions are listed with their tiles."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triplane.explain_cli import explain_target
from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.explain import InputRegion, explain, render_text
from triplane.scheduler.compiler.layout import Layout, lay_out
from triplane.scheduler.compiler.pipeline import compile_graph
from triplane.scheduler.compiler.placement import place
from triplane.scheduler.compiler.planview import plan_document

MiB = 1 << 20
N = 2048  # 16 MiB of float32: over the 4 MiB below which a graph is not cut


def _figs(n: int = 2) -> list[NodeFigures]:
    # 64 MiB nodes: the tiler cuts the 16 MiB input into strips
    return [NodeFigures(f"e{i}", 50.0, 10.0, 64 * MiB) for i in range(n)]


def _chain() -> Graph:
    """exp(x * 2 + 1).sum() on an N x N input: fusion makes one fused task per strip."""
    b = Builder()
    x = b.add_node("input", [], {"tensor": "arg0", "shape": (N, N), "dtype": "float32"}, node_id="x")
    two = b.op("full", shape=(), value=2.0, dtype="float32")
    one = b.op("full", shape=(), value=1.0, dtype="float32")
    y = b.op("sum", b.op("exp", b.op("add", b.op("mul", x, two), one)))
    return validate(b.graph([y]))


def _chain_doc(**lay: Any) -> tuple[dict[str, Any], Layout]:
    plan = compile_graph(_chain())
    (out,) = plan.graph.outputs
    layout = lay_out(plan.graph, _figs(), **lay)
    assert layout.tiled, "the tiler did not cut the input: the test needs a bigger one"
    return plan_document("j1", layout, {"x": "pixels", out: "total"}, {}, complete=False), layout


def _covered_once(shape: Sequence[int], regions: Sequence[Sequence[Sequence[int]]]) -> bool:
    count = np.zeros(shape, dtype=np.int32)
    for r in regions:
        count[tuple(slice(lo, hi) for lo, hi in r)] += 1
    return bool((count == 1).all())


def test_the_input_is_listed_with_the_grid_of_its_strips_and_each_task_reads_its_strip() -> None:
    doc, lay = _chain_doc()
    by_name = {t["tensor"]: t for t in doc["tensors"]}
    assert list(by_name) == ["pixels", "total"]  # the input first; the output last, as before
    x = by_name["pixels"]
    assert x["type"] == f"float32[{N}, {N}]"
    assert x["grid"][0] >= 2 and x["grid"][1:] == [1], x["grid"]
    assert len(x["tiles"]) == x["grid"][0]
    assert _covered_once((N, N), [t["region"] for t in x["tiles"]])
    for k, tile in enumerate(x["tiles"]):
        (lo, hi), whole = tile["region"]
        assert tile["index"] == [k, 0] and whole == [0, N]
        assert tile["type"] == f"float32[{hi - lo}, {N}]" and tile["node"] == "scheduler"
        assert lay.regions[tile["tile"]][1] == tuple(map(tuple, tile["region"]))
    tile_of = {t["tile"]: t for t in x["tiles"]}

    fused = [t for t in doc["tasks"] if t["op"] == "fused"]
    assert len(fused) == len(x["tiles"])
    read = []
    for t in fused:
        (r,) = t["reads"]
        assert r["of"] == "pixels" and r["tensor"] in tile_of and r["node"] == "scheduler"
        assert r["region"] == tile_of[r["tensor"]]["region"] and r["type"] == tile_of[r["tensor"]]["type"]
        assert [p["tensor"] for p in t["pulls"]] == [r["tensor"]]  # pulls stay as they were
        read.append(r["region"])
    assert _covered_once((N, N), read)

    # The partial sums are read by the add that makes the scalar: pieces of "total", no box of it.
    (final,) = [t for t in doc["tasks"] if t["op"] != "fused"]
    assert {r["tensor"] for r in final["reads"]} == {t["task"] for t in fused}
    for r in final["reads"]:
        assert r["of"] == "total" and r["region"] is None and r["type"] == "float32[]"
        assert r["node"] == next(t["node"] for t in fused if t["task"] == r["tensor"])
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc


def test_a_strip_cached_on_the_task_node_is_read_there() -> None:
    # every upload tile is kept by e1: tasks placed there read it locally
    doc, _ = _chain_doc(cached=lambda arg, region: ("e1",))
    fused = [t for t in doc["tasks"] if t["op"] == "fused"]
    assert any(t["node"] == "e1" for t in fused)
    for t in fused:
        (r,) = t["reads"]
        assert r["node"] == ("e1" if t["node"] == "e1" else "scheduler")


def test_the_text_shows_each_task_reads_its_strip() -> None:
    doc, _ = _chain_doc()
    text = render_text(doc, width=220)
    x = next(t for t in doc["tensors"] if t["tensor"] == "pixels")
    for tile in x["tiles"]:
        (lo, hi), _ = tile["region"]
        task = next(t for t in doc["tasks"] if t["reads"] and t["reads"][0]["tensor"] == tile["tile"])
        row = next(ln for ln in text.splitlines() if ln.startswith(f"│ {task['task']} "))
        cells = [c.strip() for c in row.strip().strip("│").split("│")]
        assert cells[-1] == f"pixels[{lo}:{hi}, :]", row
    grid = "x".join(map(str, x["grid"]))
    assert any(ln.startswith("│ pixels ") and f"│ {grid} " in ln for ln in text.splitlines()), text


def test_a_k_split_matmul_reads_the_matching_blocks_of_a_and_b() -> None:
    b = Builder()
    a = b.add_node("input", [], {"tensor": "arg0", "shape": (64, 96), "dtype": "float32"}, node_id="a")
    w = b.add_node("input", [], {"tensor": "arg1", "shape": (96, 32), "dtype": "float32"}, node_id="w")
    b.add_node("matmul", [a, w], {}, node_id="y")
    plan = compile_graph(validate(b.graph(["y"])))
    lay = lay_out(plan.graph, _figs(), explicit={"y": {"m": 32, "k": 48}})  # M: 2 blocks, K: 2 blocks
    doc = plan_document("j2", lay, {}, {}, complete=False)
    tensors = {t["tensor"]: t for t in doc["tensors"]}
    assert [tensors[n]["grid"] for n in ("a", "w", "y")] == [[2, 2], [2, 1], [2, 1]]
    tasks = {t["task"]: t for t in doc["tasks"]}
    blocks = set()
    for t in tasks.values():
        if t["op"] != "matmul":
            continue
        ra, rw = t["reads"]
        assert ra["of"] == "a" and rw["of"] == "w" and ra["type"] == "float32[32, 48]"
        assert ra["region"][1] == rw["region"][0], "A's K block is not B's"  # the same K range
        assert rw["region"][1] == [0, 32]
        blocks.add((tuple(ra["region"][0]), tuple(ra["region"][1])))
    assert blocks == {(m, k) for m in ((0, 32), (32, 64)) for k in ((0, 48), (48, 96))}
    # each output tile adds the two partial products of its own rows of A
    for tile in tensors["y"]["tiles"]:
        rows = tile["region"][0]
        add = tasks[tile["tile"]]
        assert add["op"] == "add" and [r["of"] for r in add["reads"]] == ["y", "y"]
        assert all(r["region"] is None for r in add["reads"])
        parts = [tasks[r["tensor"]]["reads"][0] for r in add["reads"]]
        assert [p["region"][0] for p in parts] == [rows, rows]
        assert sorted(p["region"][1] for p in parts) == [[0, 48], [48, 96]]


def test_regions_that_overlap_are_listed_without_a_grid() -> None:
    b = Builder()
    r1 = b.add_node("input", [], {"tensor": "arg0", "shape": (6,), "dtype": "float32"}, node_id="r1")
    r2 = b.add_node("input", [], {"tensor": "arg0", "shape": (6,), "dtype": "float32"}, node_id="r2")
    g = b.graph([b.op("exp", r1), b.op("exp", r2)])
    p = place(g, _figs())
    xtype = g.nodes["r1"].type._replace(shape=(10,))
    regions = {"r1": InputRegion("x", xtype, ((0, 6),)), "r2": InputRegion("x", xtype, ((4, 10),))}
    doc = explain(g, p, tiles={}, regions=regions)
    (x,) = doc["tensors"]
    assert x["tensor"] == "x" and x["type"] == "float32[10]" and x["grid"] is None
    assert [(t["tile"], t["index"], t["region"]) for t in x["tiles"]] == [("r1", None, [[0, 6]]),
                                                                            ("r2", None, [[4, 10]])]
    reads = sorted(r["region"] for t in doc["tasks"] for r in t["reads"])
    assert reads == [[[0, 6]], [[4, 10]]]
    assert "irregular" in render_text(doc, width=200)


def test_regions_that_leave_part_unread_are_listed_without_a_grid() -> None:
    b = Builder()
    r1 = b.add_node("input", [], {"tensor": "arg0", "shape": (4,), "dtype": "float32"}, node_id="r1")
    g = b.graph([b.op("exp", r1)])
    p = place(g, _figs())
    xtype = g.nodes["r1"].type._replace(shape=(10,))
    doc = explain(g, p, tiles={}, regions={"r1": InputRegion("x", xtype, ((2, 6),))})
    (x,) = doc["tensors"]
    assert x["grid"] is None and x["tiles"][0]["index"] is None


def test_an_untiled_plan_reads_whole_tensors() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(8, 8), dtype="float32")
    g = b.graph([b.op("matmul", x, b.op("uniform", shape=(8, 8), seed=1))])
    p = place(g, _figs())
    doc = explain(g, p)
    (mm,) = [t for t in doc["tasks"] if t["op"] == "matmul"]
    assert [r["tensor"] for r in mm["reads"]] == list(g.nodes[mm["task"]].inputs)
    assert all(r["of"] is None and r["region"] is None for r in mm["reads"])
    assert mm["reads"][0]["node"] == "scheduler"
    assert mm["reads"][1]["node"] == p.node_of(mm["reads"][1]["tensor"])
    (xt,) = [t for t in doc["tensors"] if t["tensor"] == x.id]
    assert xt["grid"] == [1, 1] and xt["tiles"][0]["region"] == [[0, 8], [0, 8]]


def test_the_explain_command_lists_an_input_cut_in_strips(tmp_path: Path) -> None:
    path = tmp_path / "chain.json"
    path.write_bytes(_chain().to_json())
    doc = explain_target(path, _figs())
    assert doc["tiled"]
    (x,) = [t for t in doc["tensors"] if t["type"] == f"float32[{N}, {N}]"]
    assert x["grid"][0] >= 2 and _covered_once((N, N), [t["region"] for t in x["tiles"]])
    fused = [t for t in doc["tasks"] if t["op"] == "fused"]
    assert all(t["reads"][0]["of"] == x["tensor"] for t in fused)


@pytest.mark.parametrize("executors", [2, 3])
def test_every_fused_task_reads_exactly_one_strip(executors: int) -> None:
    plan = compile_graph(_chain())
    lay = lay_out(plan.graph, _figs(executors))
    doc = plan_document("j3", lay, {}, {}, complete=False)
    x = next(t for t in doc["tensors"] if t["tensor"] == "x")
    fused = [t for t in doc["tasks"] if t["op"] == "fused"]
    assert sorted(t["reads"][0]["tensor"] for t in fused) == sorted(t["tile"] for t in x["tiles"])


def test_a_random_source_made_piece_by_piece_is_listed_with_its_tiles() -> None:
    # A random tensor is not laid out on a grid: the tiler makes it region by region, as
    # its readers need. The plan still lists it with its tiles, where each is made, and
    # the fused tasks read "x[lo:hi, :]" of it, not an anonymous tile id.
    b = Builder()
    x = b.add_node("normal", [], {"shape": (N, N), "seed": 3, "dtype": "float32"}, node_id="x")
    two = b.op("full", shape=(), value=2.0, dtype="float32")
    y = b.op("sum", b.op("exp", b.op("mul", x, two)))
    plan = compile_graph(validate(b.graph([y])))
    (out,) = plan.graph.outputs
    lay = lay_out(plan.graph, _figs())
    assert lay.tiled and lay.made, "the tiler did not cut the source: the test needs a bigger one"
    doc = plan_document("j1", lay, {"x": "noise", out: "total"}, {}, complete=False)
    (noise,) = [t for t in doc["tensors"] if t["tensor"] == "noise"]
    assert noise["type"] == f"float32[{N}, {N}]" and len(noise["tiles"]) >= 2
    assert _covered_once((N, N), [t["region"] for t in noise["tiles"]])
    tasks = {t["task"]: t for t in doc["tasks"]}
    for tile in noise["tiles"]:
        assert tasks[tile["tile"]]["op"] == "normal" and tile["node"] == tasks[tile["tile"]]["node"]
    reads = [r for t in doc["tasks"] if t["op"] == "fused" for r in t["reads"]]
    assert reads and all(r["of"] == "noise" and r["region"] is not None for r in reads)
    assert doc["tensors"][-1]["tensor"] == "total"  # the output stays last
    assert "noise[0:" in render_text(doc)
