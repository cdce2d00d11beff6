"""Dead-code elimination: drop every node no output depends on."""

from __future__ import annotations

from triplane.proto.ir import Graph


def dce(graph: Graph) -> Graph:
    live: set[str] = set()
    stack = list(graph.outputs)
    while stack:
        nid = stack.pop()
        if nid in live:
            continue
        live.add(nid)
        stack.extend(graph.nodes[nid].inputs)
    if len(live) == len(graph.nodes):
        return graph
    return Graph({k: n for k, n in graph.nodes.items() if k in live}, graph.outputs, graph.version)
