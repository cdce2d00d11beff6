"""Common subexpression elimination: nodes with the same op, inputs and attributes
compute the same value (kernels are deterministic, random ops are functions of their
seed), so all but the first are dropped and their readers rewired."""

from __future__ import annotations

from typing import Any

from triplane.proto.ir import Graph, Node


def cse(graph: Graph) -> Graph:
    canon: dict[tuple[Any, ...], str] = {}
    same: dict[str, str] = {}
    nodes: dict[str, Node] = {}
    for nid in graph.topo_order():
        n = graph.nodes[nid]
        inputs = tuple(same.get(i, i) for i in n.inputs)
        key = (n.op, inputs, n.attrs, n.shape, n.dtype)
        first = canon.get(key)
        if first is not None:
            same[nid] = first
            continue
        canon[key] = nid
        nodes[nid] = n if inputs == n.inputs else n.replace(inputs=inputs)
    if not same:
        return graph
    return Graph(nodes, tuple(same.get(o, o) for o in graph.outputs), graph.version)
