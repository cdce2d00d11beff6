"""What a submit of many small tasks costs in ``layout``: the support check builds one task
view per distinct (op, dtypes), and the size test stops at the node that passes the limit."""

from __future__ import annotations

from typing import Any

import pytest

from triplane.proto.ir import Graph, Node
from triplane.scheduler.compiler import layout
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.placement import PlacementError


def _scalars(n: int, extra: dict[str, Any] | None = None) -> Graph:
    nodes = {f"f{i}": {"op": "full", "shape": [], "dtype": "float32",
                       "attrs": {"value": float(i), "shape": [], "dtype": "float32"}} for i in range(n)}
    nodes.update(extra or {})
    return Graph.from_dict({"version": 1, "nodes": nodes, "outputs": list(nodes)})


def _figs(dtypes: frozenset[str] | None = None) -> list[NodeFigures]:
    return [NodeFigures(f"e{i}", 50.0, 10.0, 1 << 30, dtypes=dtypes) for i in range(2)]


def _count_task_costs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tasks whose view (and with it the op's cost function) the support check builds."""
    seen: list[str] = []
    real = layout.task_view

    def counting(graph: Graph, task: str) -> Any:
        seen.append(task)
        return real(graph, task)

    monkeypatch.setattr(layout, "task_view", counting)
    return seen


def test_support_is_checked_once_per_op_and_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    costed = _count_task_costs(monkeypatch)
    neg = {"n0": {"op": "neg", "inputs": ["f0"], "shape": [], "dtype": "float32"},
           "n1": {"op": "neg", "inputs": ["f1"], "shape": [], "dtype": "float32"}}
    layout.check_support(_scalars(500, neg), _figs())
    assert costed == ["f0", "n0"]


def test_the_unsupported_task_is_still_named(monkeypatch: pytest.MonkeyPatch) -> None:
    costed = _count_task_costs(monkeypatch)
    bad = {"d": {"op": "full", "shape": [], "dtype": "float64",
                 "attrs": {"value": 1.0, "shape": [], "dtype": "float64"}}}
    with pytest.raises(PlacementError) as e:
        layout.lay_out(_scalars(300, bad), _figs(dtypes=frozenset({"float32"})))
    assert e.value.node == "d" and "no engine supports full on float64" in str(e.value)
    assert costed == ["f0", "d"]


def test_the_size_test_stops_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _scalars(1000)  # 4 bytes each
    assert layout.bigger_than(g, 3999) and not layout.bigger_than(g, 4000)
    sized: list[Node] = []
    real = Node.type
    monkeypatch.setattr(Node, "type", property(lambda n: sized.append(n) or real.fget(n)))  # type: ignore[attr-defined]
    big = Graph.from_dict({"version": 1, "outputs": ["a", "b", "c"], "nodes": {
        "a": {"op": "full", "shape": [1024, 1024], "dtype": "float32",
              "attrs": {"value": 0.0, "shape": [1024, 1024], "dtype": "float32"}},
        "b": {"op": "full", "shape": [1024, 1024], "dtype": "float64",
              "attrs": {"value": 0.0, "shape": [1024, 1024], "dtype": "float64"}},
        "c": {"op": "full", "shape": [], "dtype": "float32",
              "attrs": {"value": 0.0, "shape": [], "dtype": "float32"}}}})
    sized.clear()
    assert layout.bigger_than(big, 8 << 20)
    assert [n.dtype for n in sized] == ["float32", "float64"]  # c is never sized
    sized.clear()
    assert not layout.bigger_than(g, 1 << 20)
    assert len(sized) == 1  # one (shape, dtype) among 1000 nodes


def test_the_same_untiled_graph_is_checked_for_support_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _count_task_costs(monkeypatch)
    g = _scalars(5)
    layout.lay_out(g, _figs())
    first = len(seen)
    assert first > 0
    layout.lay_out(g, _figs())  # a training loop's next step: the plan cache's same graph
    assert len(seen) == first
    layout.lay_out(_scalars(5), _figs())  # another graph object is checked
    assert len(seen) == 2 * first
    with pytest.raises(PlacementError):  # engines that lack a dtype: checked, refused again
        layout.lay_out(g, _figs(dtypes=frozenset({"int64"})))
    with pytest.raises(PlacementError):
        layout.lay_out(g, _figs(dtypes=frozenset({"int64"})))
