"""Constant folding: a node all of whose inputs are constants (``full`` or ``constant``
nodes, or nodes folded before it) is computed now, on the reference engine, and replaced
by its value, under its own id: a ``full`` node when every element is the same (bit for
bit), else a ``constant`` with inline data.

Left alone: results larger than ``max_elements`` (folding them would bloat the plan with
data), random ops (cheaper to make where they are used), host inputs (their values are
not part of the plan), ops the reference engine has no kernel for, and nodes whose kernel
fails (the error is the user's and surfaces, naming the node, when the plan runs).
"""

from __future__ import annotations

import math

import numpy as np

from triplane.proto import optable
from triplane.proto.errors import KernelError
from triplane.proto.ir import Attrs, Graph, Node, encode_data

FOLDABLE_SOURCES = frozenset({"full", "constant"})
MAX_FOLD_ELEMENTS = 4096


def fold_constants(graph: Graph, max_elements: int = MAX_FOLD_ELEMENTS) -> Graph:
    from triplane.engines.registry import get_op_engine

    engine = get_op_engine("numpy")
    values: dict[str, np.ndarray] = {}
    small_sources: set[str] = set()  # computed only when a reader folds (most never do)
    nodes: dict[str, Node] = {}
    changed = False

    def known(i: str) -> bool:
        return i in values or i in small_sources

    def value(i: str) -> np.ndarray:
        if i not in values:
            src = graph.nodes[i]
            values[i] = engine.run(src.op, [], src.attrs, src.type)
        return values[i]

    for nid in graph.topo_order():
        n = graph.nodes[nid]
        if n.op in FOLDABLE_SOURCES:
            nodes[nid] = n
            if n.type.size <= max_elements:
                small_sources.add(nid)
            continue
        opdef = optable.get(n.op)
        foldable = (n.inputs and all(known(i) for i in n.inputs)
                    and n.type.size <= max_elements and not opdef.random and not opdef.internal
                    and engine.supports(n.op))
        if not foldable:
            nodes[nid] = n
            continue
        try:
            v = engine.run(n.op, [value(i) for i in n.inputs], n.attrs, n.type)
        except KernelError:
            nodes[nid] = n
            continue
        values[nid] = v
        nodes[nid] = constant_node(v, n)
        changed = True
    if not changed:
        return graph
    return Graph(nodes, graph.outputs, graph.version)


def constant_node(value: np.ndarray, like: Node) -> Node:
    """The smallest node holding ``value``: ``full`` if every element has the same bits
    and that value survives JSON (finite, not -0.0), else ``constant``."""
    value = np.ascontiguousarray(value, dtype=like.type.dtype.np)
    flat = value.reshape(-1)
    base = {"shape": like.shape, "dtype": like.dtype}
    if flat.size and _uniform(flat):
        first = flat[0].item()
        if not isinstance(first, float) or (math.isfinite(first) and not (
                first == 0 and math.copysign(1.0, first) < 0)):
            return Node("full", (), Attrs({"value": first, **base}), like.shape, like.dtype)
    return Node("constant", (), Attrs({"data": encode_data(value), **base}), like.shape, like.dtype)


def _uniform(flat: np.ndarray) -> bool:
    # Bitwise, so 0.0 and -0.0 (equal as numbers) are told apart.
    raw = flat.view(np.uint8).reshape(flat.size, flat.dtype.itemsize)
    return bool(np.all(raw == raw[0]))
