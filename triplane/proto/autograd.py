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

from collections.abc import Mapping, Sequence
from typing import Any

from triplane.proto import optable
from triplane.proto.builder import Builder, Ref
from triplane.proto.errors import GraphError, NotDifferentiableError
from triplane.proto.ir import Attrs, Graph, Node
from triplane.proto.limits import MAX_ID_LENGTH
from triplane.proto.opdef import GradCtx
from triplane.proto.validate import check_id, validate


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


GRAD_PREFIX = "grad:"
"""A job's ``grad`` request names the gradient of its ``of`` node with respect to ``w``
``grad:<w>``: a node id like any other, fetched by that name (a ref to it from a later job
is ``<job>:grad:<w>``; a job id never holds ':', so the first ':' ends it)."""


def named_gradients(graph: Graph, of: str, wrt: Sequence[str]) -> tuple[Graph, list[str]]:
    """``graph`` with the gradients of ``of`` (a scalar) with respect to each ``wrt`` node
    appended as the nodes ``grad:<w>`` (:data:`GRAD_PREFIX`), and their ids in ``wrt``'s
    order; the graph's outputs are its own followed by them. ``graph`` is validated first
    (its attributes normalised, as the gradient rules read them). Raises GraphError for an
    unknown node, a repeated ``wrt`` or a name the graph uses already, and
    NotDifferentiableError as :func:`autograd` does."""
    names = [GRAD_PREFIX + w for w in wrt]
    if len(set(wrt)) != len(wrt):
        raise GraphError(f"'wrt' names a node twice: {list(wrt)}")
    for w, name in zip(wrt, names):
        if w not in graph.nodes:
            raise GraphError(f"'wrt' names {w!r}, which is not a node of the graph", node=w)
        if name in graph.nodes:
            raise GraphError(f"the graph has a node {name!r} already: that name is the gradient's",
                             node=name, op=graph.nodes[name].op)
    if of not in graph.nodes:
        raise GraphError(f"'of' names {of!r}, which is not a node of the graph", node=of)
    graph = validate(graph)  # the gradient rules read normalised attributes
    g, ids = autograd(graph, of, wrt, prefix="_grad")
    nodes = dict(g.nodes)
    rename: dict[str, str] = {}
    for gid, name in zip(ids, names):
        if gid in graph.nodes or gid in rename:  # a forward node or another w's gradient
            node = nodes[gid]
            nodes[name] = Node("reshape", (rename.get(gid, gid),), Attrs({"shape": node.shape}),
                               node.shape, node.dtype)
        else:
            rename[gid] = name
    if rename:
        nodes = {rename.get(k, k): (n if not any(i in rename for i in n.inputs)
                                    else n.replace(inputs=[rename.get(i, i) for i in n.inputs]))
                 for k, n in nodes.items()}
    outputs = (*graph.outputs, *(n for n in names if n not in graph.outputs))
    return Graph(nodes, outputs, g.version).sorted(), names


MAX_WRT = 4096


def check_grad_request(value: Any) -> tuple[str, list[str]]:
    """(of, wrt) of a job's ``grad`` field, ``{"of": <node id>, "wrt": [<node id>, ...]}``,
    checked as the front door checks ids (``validate.check_id``): GraphError naming the
    field. Whether the nodes exist is :func:`named_gradients`' to say."""
    if not isinstance(value, Mapping) or set(value) != {"of", "wrt"}:
        raise GraphError('\'grad\' must be {"of": <node id>, "wrt": [<node id>, ...]}')
    of, wrt = value["of"], value["wrt"]
    check_id(of, "grad.of")
    if not isinstance(wrt, list) or not 0 < len(wrt) <= MAX_WRT:
        raise GraphError(f"'grad.wrt' must be a list of 1..{MAX_WRT} node ids")
    for i, w in enumerate(wrt):
        check_id(w, f"grad.wrt[{i}]")
        if len(GRAD_PREFIX) + len(w) > MAX_ID_LENGTH:
            raise GraphError(f"grad.wrt[{i}] is {len(w)} characters long: its gradient's name "
                             f"{GRAD_PREFIX}<id> would pass the id limit of {MAX_ID_LENGTH}", node=w)
    return of, list(wrt)
