"""Common subexpression elimination: nodes with the same op, inputs and attributes
compute the same value (kernels are deterministic, random ops are functions of their
seed), so one node per value is kept and the readers of the others are rewired to it.

``input`` nodes bound to the same host tensor are one value; bound to different tensors
(a different ``tensor`` attribute) they are not, so they never merge.

Graph outputs keep their ids: the representative of a class of equal nodes is its first
output member (else its first member), and a second output of the same value stays a
node of its own (its inputs still merged), so callers can read every output by the id
they asked for.
"""

from __future__ import annotations

from typing import Any

from triplane.proto.ir import Graph, Node


def cse(graph: Graph) -> Graph:
    outputs = set(graph.outputs)
    order = graph.topo_order()
    label: dict[str, str] = {}  # node -> its class (the class's first member)
    first_of: dict[tuple[Any, ...], str] = {}
    rep: dict[str, str] = {}  # class -> the id that stands for it
    for nid in order:
        n = graph.nodes[nid]
        key = (n.op, tuple(label[i] for i in n.inputs), n.attrs, n.shape, n.dtype)
        cls = first_of.get(key)
        if cls is None or (nid in outputs and rep[cls] in outputs):
            # A new class (or a second output of a value: it stays, as its own class).
            first_of.setdefault(key, nid)
            label[nid] = rep[nid] = nid
            continue
        label[nid] = cls
        if nid in outputs and rep[cls] not in outputs:
            rep[cls] = nid
    if len(rep) == len(graph.nodes):
        return graph
    nodes: dict[str, Node] = {}
    for nid in order:
        if label[nid] != nid:
            continue  # a merged node: its class was emitted at its first member
        n = graph.nodes[nid]
        inputs = tuple(rep[label[i]] for i in n.inputs)
        nodes[rep[nid]] = n if inputs == n.inputs else n.replace(inputs=inputs)
    return Graph(nodes, graph.outputs, graph.version)
