"""Reverse-mode differentiation as a graph pass.

``autograd(graph, loss, wrt)`` appends to ``graph`` the nodes that compute d loss / d w
for each ``w`` in ``wrt`` and returns the new graph with the gradient ids. Gradients are
themselves ordinary nodes, so they can be differentiated again (higher order) wherever
the rules they use have gradients of their own.

Only floating-point nodes carry gradients; integer and boolean values (indices, masks,
argmax) stop them. Asking for a gradient through an op with no rule raises
NotDifferentiableError naming the node and op.
"""

from __future__ import annotations

from collections.abc import Sequence

from triplane.proto import optable
from triplane.proto.builder import Builder, Ref
from triplane.proto.errors import GraphError, NotDifferentiableError
from triplane.proto.ir import Graph
from triplane.proto.opdef import GradCtx


def autograd(graph: Graph, loss: str, wrt: Sequence[str], grad_output: str | None = None,
             *, prefix: str = "_g") -> tuple[Graph, list[str]]:
    """Differentiate ``loss`` with respect to the nodes ``wrt``.

    ``grad_output`` is the id of the incoming gradient (same shape as ``loss``); it is
    required when ``loss`` is not a scalar (0-d or of one element). The returned graph's
    outputs are ``graph.outputs`` followed by the gradient ids, one per ``wrt`` entry.
    """
    for w in (loss, *wrt):
        if w not in graph.nodes:
            raise GraphError(f"{w!r} is not a node of the graph")
    lnode = graph.nodes[loss]
    if not lnode.type.dtype.is_float:
        raise NotDifferentiableError(f"the loss {loss!r} has dtype {lnode.dtype}; gradients need floats")
    for w in wrt:
        if not graph.nodes[w].type.dtype.is_float:
            raise NotDifferentiableError(
                f"{w!r} has dtype {graph.nodes[w].dtype}: only floating-point tensors have gradients")

    b = Builder(graph.nodes, prefix=prefix)
    if grad_output is None:
        if lnode.type.size != 1:
            raise NotDifferentiableError(
                f"the loss {loss!r} has shape {list(lnode.shape)}; a gradient of a non-scalar "
                "needs grad_output (the gradient flowing into it)")
        seed = b.const(1.0, lnode.type.dtype, lnode.shape)
    else:
        seed = b.ref(grad_output)
        if seed.type != lnode.type:
            raise GraphError(f"grad_output has type {seed.type}, the loss has {lnode.type}")

    order = graph.topo_order()
    wanted = set(wrt)
    # Nodes that depend on some w (forward) and that the loss depends on (backward).
    depends_on_w: set[str] = set()
    for nid in order:
        if nid in wanted or any(i in depends_on_w for i in graph.nodes[nid].inputs):
            depends_on_w.add(nid)
    needed: set[str] = set()
    stack = [loss]
    while stack:
        nid = stack.pop()
        if nid in needed or nid not in depends_on_w:
            continue
        needed.add(nid)
        stack.extend(graph.nodes[nid].inputs)

    grads: dict[str, Ref] = {loss: seed} if loss in needed else {}
    for nid in reversed(order):
        if nid not in needed or nid not in grads:
            continue
        node = graph.nodes[nid]
        if not node.inputs:
            continue
        if not any(i in needed and graph.nodes[i].type.dtype.is_float for i in node.inputs):
            continue
        opdef = optable.get(node.op)
        if opdef.grad is None:
            raise NotDifferentiableError(
                f"node {nid!r} ({node.op}): {node.op} has no gradient, and a gradient was asked "
                "through it")
        ctx = GradCtx(tuple(b.ref(i) for i in node.inputs), b.ref(nid), node.attrs)
        try:
            contribs = list(opdef.grad(b, ctx, grads[nid]))
        except NotDifferentiableError as e:
            raise NotDifferentiableError(f"node {nid!r} ({node.op}): {e}") from None
        if len(contribs) != len(node.inputs):
            raise AssertionError(f"gradient rule of {node.op} returned {len(contribs)} gradients "
                                 f"for {len(node.inputs)} inputs")
        for idx, (inp, gi) in enumerate(zip(node.inputs, contribs)):
            if inp not in needed or not graph.nodes[inp].type.dtype.is_float:
                continue
            if gi is None:
                why = "it is an index/label input" if idx in opdef.nograd_inputs else "no rule for it"
                raise NotDifferentiableError(
                    f"node {nid!r} ({node.op}): no gradient flows to input {idx} ({inp!r}): {why}")
            itype = graph.nodes[inp].type
            if gi.type != itype:
                raise AssertionError(f"gradient rule of {node.op} gave {gi.type} for input {idx} "
                                     f"of type {itype}")
            grads[inp] = grads[inp] + gi if inp in grads else gi

    out_ids: list[str] = []
    for w in wrt:
        g = grads.get(w)
        if g is None:  # the loss does not depend on w
            g = b.zeros_like(b.ref(w))
        out_ids.append(g.id)
    return b.graph((*graph.outputs, *out_ids)), out_ids
