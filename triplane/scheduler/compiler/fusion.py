"""Elementwise fusion: a chain of elementwise ops becomes one ``fused`` node.

A value joins its reader's group when the value is elementwise, read by that one node
only, not a graph output, and of the reader's shape (or a 0-d ``full`` constant, which is
copied into the program). Groups of two or more compute ops become a ``fused`` node that
keeps the id of the group's last node (its root), so readers and outputs need no
rewiring. Values of other shapes (broadcast operands) are inputs of the fused node. The
numpy engine then runs the program slice by slice: temporaries are the size of a slice,
not of the tensor.

A reduction with a combine (sum, prod, max, min, mean: any axes) whose input is an
elementwise value read by it alone (and not an output) joins that value's group as the
program's last step, the *reduction epilogue*: the fused node keeps the reduction's id
and type, and the engine reduces each slice as it goes, so the chain's result (a whole
tensor, 64 MiB for a 2048 x 8192 float32 tile) is never made. ``exp(x * 2 + 1).sum()``
becomes one node. Not for bool inputs (max/min of bools have no numeric combine).

Never fused: random ops (their values depend on the element's index in the whole
tensor, which a slice does not know) and bfloat16 values (engines compute bfloat16 ops in
float32 and round each result; a fused program would skip the rounding in between).
"""

from __future__ import annotations

from triplane.proto import optable
from triplane.proto.ir import Attrs, Graph, Node, thaw
from triplane.proto.ops.fused import is_reduction


def _is_scalar_const(n: Node) -> bool:
    return n.op == "full" and n.shape == ()


def fuse_elementwise(graph: Graph) -> Graph:
    order = graph.topo_order()
    users = graph.consumers()
    outputs = set(graph.outputs)
    table = optable.table()

    def elementwise(nid: str) -> bool:
        n = graph.nodes[nid]
        opdef = table.get(n.op)
        return (opdef is not None and opdef.elementwise and not opdef.random
                and n.dtype != "bfloat16"
                and all(graph.nodes[i].dtype != "bfloat16" for i in n.inputs))

    def single(i: str) -> bool:
        return len(users[i]) == 1 and i not in outputs

    # absorbed[v] = the node whose group v joins
    absorbed: dict[str, str] = {}
    epilogues: set[str] = set()  # reductions that end their input's group
    for nid in order:
        node = graph.nodes[nid]
        if not elementwise(nid):
            i = node.inputs[0] if len(node.inputs) == 1 else None
            if (i is not None and is_reduction(node.op) and single(i) and elementwise(i)
                    and not _is_scalar_const(graph.nodes[i]) and graph.nodes[i].dtype != "bool"):
                absorbed[i] = nid
                epilogues.add(nid)
            continue
        for i in node.inputs:
            src = graph.nodes[i]
            if not single(i):
                continue
            if _is_scalar_const(src) or (elementwise(i) and src.shape == node.shape):
                absorbed[i] = nid

    def root(nid: str) -> str:
        while nid in absorbed:
            nid = absorbed[nid]
        return nid

    members: dict[str, list[str]] = {}
    for nid in order:
        if nid in absorbed or nid in epilogues or elementwise(nid):
            members.setdefault(root(nid), []).append(nid)
    fused: dict[str, Node] = {}
    for r, group in members.items():
        computing = [m for m in group if not _is_scalar_const(graph.nodes[m])]
        if len(computing) >= 2:
            node = _fused_node(graph, group)
            # A group reading nothing from outside is all constants (folding's job); a
            # fused node needs at least one input.
            if node.inputs:
                fused[r] = node
    nodes: dict[str, Node] = {}
    for nid in order:
        r = root(nid)
        if r not in fused:
            nodes[nid] = graph.nodes[nid]
        elif nid == r:
            nodes[nid] = fused[r]
        # else: a member of a fused group, emitted with (as) its root
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
