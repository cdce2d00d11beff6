"""Constant folding: a node all of whose inputs are constants (``full`` or ``constant``
nodes, or nodes folded before it) is computed now, on the reference engine, and replaced
by its value: a ``full`` node when every element is the same, else a ``constant`` with
inline data. Results larger than ``max_elements`` stay in the graph (folding them would
bloat the plan with data), as do random ops (cheaper to make where they are used) and
host inputs (their values are not part of the plan)."""

from __future__ import annotations

import base64

import numpy as np

from triplane.proto import optable
from triplane.proto.ir import Attrs, Graph, Node

FOLDABLE_SOURCES = frozenset({"full", "constant"})
MAX_FOLD_ELEMENTS = 4096


def fold_constants(graph: Graph, max_elements: int = MAX_FOLD_ELEMENTS) -> Graph:
    from triplane.engines.registry import get_op_engine

    engine = get_op_engine("numpy")
    values: dict[str, np.ndarray] = {}
    nodes: dict[str, Node] = {}
    changed = False
    for nid in graph.topo_order():
        n = graph.nodes[nid]
        if n.op in FOLDABLE_SOURCES:
            nodes[nid] = n
            if n.type.size <= max_elements:
                values[nid] = engine.run(n.op, [], n.attrs, n.type)
            continue
        foldable = (n.inputs and all(i in values for i in n.inputs)
                    and n.type.size <= max_elements and not optable.get(n.op).random
                    and engine.supports(n.op))
        if not foldable:
            nodes[nid] = n
            continue
        v = engine.run(n.op, [values[i] for i in n.inputs], n.attrs, n.type)
        values[nid] = v
        nodes[nid] = constant_node(v, n)
        changed = True
    if not changed:
        return graph
    return Graph(nodes, graph.outputs, graph.version)


def constant_node(value: np.ndarray, like: Node) -> Node:
    """The smallest node holding ``value``: ``full`` if uniform, else ``constant``."""
    flat = value.reshape(-1)
    base = {"shape": like.shape, "dtype": like.dtype}
    if flat.size and like.type.dtype.name != "bfloat16" and np.all(flat == flat[0]) \
            and not (flat.dtype.kind == "f" and np.isnan(flat[0])):
        return Node("full", (), Attrs({"value": flat[0].item(), **base}), like.shape, like.dtype)
    data = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()
    return Node("constant", (), Attrs({"data": base64.b64encode(data).decode("ascii"), **base}),
                like.shape, like.dtype)
