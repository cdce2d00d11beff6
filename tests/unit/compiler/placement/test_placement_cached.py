"""Inputs cached on executors: local there (no pull, no comm time), never a pull source,
reclaimable memory, stale names ignored, and the result deterministic."""

from __future__ import annotations

import pytest

from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import SCHEDULER, CostModel, NodeFigures
from triplane.scheduler.compiler.placement import PlacementError, place

EXACT = CostModel(task_overhead_s=0.0)
S = 100 * 100 * 4  # bytes of one input


def fig(name: str, *, bw: float = 1.0, mem: int = 2**30) -> NodeFigures:
    return NodeFigures(name, gflops=1.0, gbps=1.0, memory_capacity=mem, bandwidth_gbps=bw, latency_us=0.0)


def tiles(k: int, op: str = "exp") -> tuple[Graph, list[str], list[str]]:
    """k upload tiles, each read by one task."""
    b = Builder()
    xs = [b.op("input", tensor=f"arg{i}", shape=(100, 100), dtype="float32") for i in range(k)]
    ys = [b.op(op, x) for x in xs]
    return b.graph(ys), [x.id for x in xs], [y.id for y in ys]


def test_each_task_runs_where_its_input_is_cached_with_no_pull() -> None:
    g, xs, ys = tiles(4)
    nodes = [fig("n0"), fig("n1")]
    cached = {x: ("n1" if i % 2 else "n0",) for i, x in enumerate(xs)}
    p = place(g, nodes, model=EXACT, cached=cached)
    for i, y in enumerate(ys):
        tp = p.tasks[y]
        assert tp.node == cached[xs[i]][0] and tp.pulls == () and tp.comm_s == 0.0
    cold = place(g, nodes, model=EXACT)
    assert all(len(cold.tasks[y].pulls) == 1 and cold.tasks[y].pulls[0].source == SCHEDULER for y in ys)
    assert p.makespan < cold.makespan


def test_a_cached_copy_is_not_a_pull_source() -> None:
    # x is cached on n0 only, but n0 is busy with the other tasks: the reader placed on n1
    # pulls x from where uploads are served (the dispatcher names the scheduler).
    b = Builder()
    x = b.op("input", tensor="arg0", shape=(100, 100), dtype="float32")
    readers = [b.op("exp", x) for _ in range(4)]
    g = b.graph(readers)
    p = place(g, [fig("n0", bw=100.0), fig("n1", bw=100.0)], model=EXACT, cached={x.id: ("n0",)})
    on_n1 = [r.id for r in readers if p.tasks[r.id].node == "n1"]
    assert on_n1, "expected the readers to spread"
    assert all(pl.source == SCHEDULER for r in on_n1 for pl in p.tasks[r].pulls)


def test_names_that_are_not_nodes_are_ignored() -> None:
    g, xs, ys = tiles(2)
    p = place(g, [fig("n0")], model=EXACT, cached={xs[0]: ("gone", "n0"), "not-an-input": ("n0",)})
    assert p.tasks[ys[0]].pulls == () and len(p.tasks[ys[1]].pulls) == 1


def test_cached_inputs_take_memory_only_while_read_there() -> None:
    # One node with room for 2.5 inputs; four cached inputs, each read by a reduction (a
    # scalar out). Held from the start, the cache would not fit (4 inputs); it is
    # reclaimable, so each input counts from its reader's dispatch to its finish.
    g, xs, ys = tiles(4, op="sum")
    node = fig("n0", mem=S * 5 // 2)
    p = place(g, [node], model=EXACT, cached={x: ("n0",) for x in xs})
    assert all(p.tasks[y].pulls == () for y in ys)
    assert 2 * S <= p.peak_memory["n0"] <= node.free
    with pytest.raises(PlacementError):  # a working set over the node's memory still fails
        place(g, [fig("n0", mem=S // 2)], model=EXACT, cached={x: ("n0",) for x in xs})


def test_placement_is_deterministic_whatever_the_order_of_holders() -> None:
    g, xs, _ = tiles(6)
    nodes = [fig("n0"), fig("n1"), fig("n2")]
    a = place(g, nodes, model=EXACT, cached={x: ("n2", "n0") for x in xs})
    b = place(g, nodes, model=EXACT, cached={x: ("n0", "n2") for x in reversed(xs)})
    assert a.to_dict() == b.to_dict()
