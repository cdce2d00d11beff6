"""Elementwise fusion: a chain of elementwise ops becomes one ``fused`` node.

A value joins its reader's group when the value is elementwise, read by that one node
only, not a graph output, and of the reader's shape (or a 0-d ``full`` constant, which is
copied into the program). Groups of two or more compute ops become a ``fused`` node that
keeps the id of the group's last node, so readers and outputs need no rewiring. The
numpy engine then runs the program slice by slice: temporaries are the size of a slice,
not of the tensor.
"""

from __future__ import annotations

from triplane.proto import optable
from triplane.proto.ir import Attrs, Graph, Node, thaw


def _is_scalar_const(n: Node) -> bool:
    return n.op == "full" and n.shape == ()


def fuse_elementwise(graph: Graph) -> Graph:
    order = graph.topo_order()
    users = graph.consumers()
    outputs = set(graph.outputs)
    table = optable.table()

    def elementwise(nid: str) -> bool:
        op = graph.nodes[nid].op
        return op in table and table[op].elementwise

    # absorbed[v] = the node whose group v joins
    absorbed: dict[str, str] = {}
    for nid in order:
        node = graph.nodes[nid]
        if not elementwise(nid):
            continue
        for i in node.inputs:
            src = graph.nodes[i]
            single = len(users[i]) == 1 and i not in outputs
            if not single:
                continue
            if _is_scalar_const(src) or (elementwise(i) and src.shape == node.shape):
                absorbed[i] = nid

    def root(nid: str) -> str:
        while nid in absorbed:
            nid = absorbed[nid]
        return nid

    members: dict[str, list[str]] = {}
    for nid in order:
        if nid in absorbed or elementwise(nid):
            members.setdefault(root(nid), []).append(nid)
    nodes: dict[str, Node] = {}
    for nid in order:
        r = root(nid)
        group = members.get(r, [])
        computing = [m for m in group if not _is_scalar_const(graph.nodes[m])]
        if len(computing) < 2:
            nodes[nid] = graph.nodes[nid]
            continue
        if nid != r:
            continue  # emitted with its root
        nodes[nid] = _fused_node(graph, group)
    if len(nodes) == len(graph.nodes):
        return graph
    return Graph({k: nodes[k] for k in order if k in nodes}, graph.outputs, graph.version)


def _fused_node(graph: Graph, group: list[str]) -> Node:
    """One fused node for ``group`` (topologically ordered, last = root)."""
    inside = set(group)
    ext: list[str] = []
    for m in group:
        for i in graph.nodes[m].inputs:
            if i not in inside and i not in ext:
                ext.append(i)
    slot = {e: k for k, e in enumerate(ext)}
    program = []
    for m in group:
        n = graph.nodes[m]
        slot[m] = len(ext) + len(program)
        program.append([n.op, [slot[i] for i in n.inputs], thaw(n.attrs)])
    root = graph.nodes[group[-1]]
    return Node("fused", tuple(ext), Attrs({"program": program}), root.shape, root.dtype)
