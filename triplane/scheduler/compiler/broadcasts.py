"""Implicit broadcasts: an elementwise op reading ``broadcast_to(y)`` reads ``y`` itself
when numpy broadcasting gives the op the same result type, so the broadcast tensor is not
made at all (DCE drops the ``broadcast_to`` once nothing reads it).

Elementwise ops broadcast their inputs as numpy does (``proto/ops/elementwise.py``), so
``mul(broadcast_to(s, (4096, 2048)), x)`` and ``mul(s, x)`` are the same value. The first
makes a 32 MiB tensor of one repeated number, tiles it, and sends those tiles to wherever
``x`` is; the second reads a few bytes. Autograd writes the first: the gradient of
``sum`` (and so of every loss) is its incoming gradient broadcast to the summed shape.

An input is replaced only when the op's own type inference, run on the new inputs, gives
exactly the node's type: a ``broadcast_to`` that sets the result's shape (no other input
is that large) stays.
"""

from __future__ import annotations

from triplane.proto import optable
from triplane.proto.errors import TriplaneError
from triplane.proto.ir import Graph

__all__ = ["fold_broadcasts"]


def fold_broadcasts(graph: Graph) -> Graph:
    nodes = dict(graph.nodes)
    changed = False
    for nid in graph.topo_order():
        n = nodes[nid]
        opdef = optable.get(n.op)
        if not n.inputs or not opdef.elementwise:
            continue
        inputs = list(n.inputs)
        for k, i in enumerate(inputs):
            src = nodes[i]
            if src.op != "broadcast_to":
                continue
            trial = [*inputs[:k], src.inputs[0], *inputs[k + 1:]]
            try:
                t = opdef.infer([nodes[j].type for j in trial], n.attrs)
            except (TriplaneError, ValueError):
                continue
            if t == n.type:
                inputs = trial
        if tuple(inputs) != tuple(n.inputs):
            nodes[nid] = n.replace(inputs=tuple(inputs))
            changed = True
    return Graph(nodes, graph.outputs, graph.version) if changed else graph
