"""``compile_job``, the one compile entry: a submitted graph and the same job compiled again
from its record give the same tasks and tiles; the plan cache is keyed by graph hash; the
cluster is what the caller passes (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.compile import ClusterSnapshot, compile_job
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.layout import figures_from_json, figures_to_json
from triplane.scheduler.compiler.pipeline import PlanCache

MiB = 1 << 20
U = "u-" + "cd" * 16


def graph(rows: int = 2048) -> Graph:
    """An upload and an elementwise chain on it: 8 MiB at 2048 rows, cut into tiles."""
    nodes = {"x": {"op": "input", "shape": [rows, 1024], "dtype": "float32",
                   "attrs": {"tensor": U, "shape": [rows, 1024], "dtype": "float32"}},
             "y": {"op": "exp", "inputs": ["x"], "shape": [rows, 1024], "dtype": "float32"},
             "z": {"op": "neg", "inputs": ["y"], "shape": [rows, 1024], "dtype": "float32"}}
    return Graph.from_dict({"version": 1, "nodes": nodes, "outputs": ["z"]})


def figs() -> tuple[NodeFigures, ...]:
    return tuple(NodeFigures(f"e{i}", 50.0, 10.0, 8 * MiB) for i in range(3))


def test_a_job_compiled_again_from_its_record_has_the_same_tasks_and_tiles() -> None:
    cache = PlanCache()
    first = compile_job(graph(), ["y", "z"], ClusterSnapshot(figs()), cache=cache)
    assert first.layout is not None and first.layout.tiled and len(first.specs) > 2
    assert first.args == (U,) and set(first.fetch) == {"y", "z"} and first.back
    # What the metadb keeps: the canonical graph, the upload ids, the fetch map, the figures.
    record = figures_to_json(first.layout.figures)
    assert first.graph is not None
    again = compile_job(first.graph, dict(first.fetch), ClusterSnapshot(tuple(figures_from_json(record))),
                        cache=PlanCache(), job=first.job, args=first.args)
    assert [(s.id, s.deps, s.op) for s in again.specs] == [(s.id, s.deps, s.op) for s in first.specs]
    assert again.templates == first.templates and again.uploads == first.uploads
    assert again.fetch_grid("z") == first.fetch_grid("z")
    assert again.back == {}  # a stored job knows canonical ids only


def test_the_plan_cache_is_keyed_by_the_canonical_graph() -> None:
    cache = PlanCache()
    a = compile_job(graph(), ["z"], cache=cache)
    b = compile_job(graph(), ["z"], cache=cache)  # the same graph, a new job
    assert a.job != b.job and cache.misses == 1 and cache.hits == 1
    compile_job(graph(rows=8), ["z"], cache=cache)
    assert cache.misses == 2


def test_the_cluster_is_what_the_caller_passes() -> None:
    asked: list[Sequence[str]] = []

    def cached(args: Sequence[str]):  # type: ignore[no-untyped-def]
        asked.append(tuple(args))
        return lambda arg, region: ()

    untiled = compile_job(graph(), ["z"], ClusterSnapshot((), cached), cache=PlanCache())
    assert untiled.layout is None and asked == []  # no executors: nothing is laid out or asked
    tiled = compile_job(graph(), ["z"], ClusterSnapshot(figs(), cached), cache=PlanCache())
    assert tiled.layout is not None and asked == [(U,)]


def test_errors_name_the_submitted_node() -> None:
    with pytest.raises(GraphError) as e:
        compile_job(graph(), ["nope"], cache=PlanCache())
    assert e.value.node == "nope" and e.value.kind == "graph"
    with pytest.raises(TypeError):  # a stored record whose fetch is not a name -> id map
        compile_job(graph(), ["z"], cache=PlanCache(), args=[U])
