"""Transposes moved onto matmul operands, and transposes of transposes removed.

Autograd writes the gradient of a weight used as ``x @ w.T`` as ``transpose(matmul(
transpose(x), g))``: a matmul whose result is read through a transposed view. Every later
elementwise pass over that gradient (an optimiser's update reads it two or three times)
then walks memory column by column, several times slower than row by row for a large
weight. And the gradient flowing back through ``w.T`` is ``transpose(transpose(w))``.

Two rewrites, each giving the same value:

* ``transpose(matmul(a, b))`` of 2-D operands, the matmul read by the transpose only,
  becomes ``matmul(b.T, a.T)``, where the transpose of a ``transpose(u)`` is ``u`` itself.
  Done only when at most one new transpose is needed (then it takes the matmul's id), so
  the graph never grows. A matmul reads a transposed operand as a view (BLAS is told the
  layout), and its result is laid out row by row. The sums may round in another order
  than before (a dot product of the same vectors; as BLAS orders them for either layout).
* ``transpose(transpose(u))`` reads ``u`` through the composed permutation; readers of
  an identity composition read ``u`` itself (not when the outer transpose is an output,
  whose id callers read).

Nodes left unread go with DCE, which the pipeline runs after this pass.
"""

from __future__ import annotations

from triplane.proto.ir import Attrs, Graph, Node

__all__ = ["fold_transposes"]

_SWAP = (1, 0)


def _is_swap(n: Node) -> bool:
    return n.op == "transpose" and len(n.shape) == 2 and tuple(n.attrs["perm"]) == _SWAP


def fold_transposes(graph: Graph) -> Graph:
    nodes = dict(graph.nodes)
    order = graph.topo_order()
    users = graph.consumers()
    outputs = set(graph.outputs)
    alias: dict[str, str] = {}  # an identity transpose -> what its readers read instead
    changed = False
    for nid in order:
        n = nodes[nid]
        if any(i in alias for i in n.inputs):
            n = nodes[nid] = n.replace(inputs=tuple(alias.get(i, i) for i in n.inputs))
            changed = True
        if n.op != "transpose":
            continue
        src = nodes[n.inputs[0]]
        if src.op == "transpose":
            perm = tuple(src.attrs["perm"][p] for p in n.attrs["perm"])
            if perm == tuple(range(len(perm))) and nid not in outputs:
                alias[nid] = src.inputs[0]
            else:
                nodes[nid] = n.replace(inputs=src.inputs, attrs=Attrs({"perm": perm}))
            changed = True
        elif (_is_swap(n) and src.op == "matmul" and users[n.inputs[0]] == [nid]
              and n.inputs[0] not in outputs
              and all(len(nodes[i].shape) == 2 for i in src.inputs)):
            mid = n.inputs[0]
            a, b = (nodes[i] for i in src.inputs)
            need = [not _is_swap(x) for x in (b, a)]
            if sum(need) > 1:
                continue
            operands = []
            for x, xid, new in ((b, src.inputs[1], need[0]), (a, src.inputs[0], need[1])):
                if new:
                    nodes[mid] = Node("transpose", (xid,), Attrs({"perm": _SWAP}), x.shape[::-1], x.dtype)
                    operands.append(mid)
                else:
                    operands.append(x.inputs[0])
            if not any(need):
                del nodes[mid]
            nodes[nid] = Node("matmul", tuple(operands), src.attrs, n.shape, n.dtype)
            changed = True
    if not changed:
        return graph
    live = [k for k in order if k in nodes]
    return Graph({k: nodes[k] for k in live}, graph.outputs, graph.version)
