"""Tracing a function or module into the graph a model file holds, and the batch rules.

``trace`` runs ``fn(*inputs)`` on lazy tensors (nothing computes) and names the graph's
``input`` nodes: ``input:<name>`` for the function's arguments, ``param:<name>`` for a
module's parameters and buffers, ``const:<k>`` for any other tensor with a value it read
(a closure's array). The graph is canonical (``Graph.canonical``: nodes ``n0, n1, ...``
in dataflow order), so equal programs give equal bytes.

The batch dimension is found by tracing three times, at the example's batch ``B`` and at
``B+1`` and ``B+2`` (the example rows repeated): integer attributes that differ between
the traces (a ``reshape`` to ``(B, 784)``, a ``full`` of shape ``(B, 10)``) are recorded
as rules ``value = scale * batch + offset``, fitted on the first two traces and checked
on the third. When the traces differ otherwise (the function branches on the batch size,
or builds a constant of the batch's size), the batch stays fixed and the reason is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from triplane.proto.ir import Attrs, Graph, Node
from triplane.sdk.autograd import no_grad
from triplane.sdk.tensor import Tensor, build_graph

__all__ = ["BatchRule", "apply_rules", "batch_rules", "trace"]

BatchRule = dict[str, Any]  # {"node", "attr", "path", "scale", "offset"}


def trace(fn: Callable[..., Any], arrays: Sequence[np.ndarray], input_names: Sequence[str],
          param_names: Mapping[int, str]) -> tuple[Graph, dict[str, np.ndarray], int]:
    """The canonical graph of ``fn(*arrays)``, the values its ``param:``/``const:`` inputs
    bind (by name, without the prefix), and the number of outputs."""
    xs = [Tensor.from_array(a) for a in arrays]
    with no_grad():
        out = fn(*xs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, o in enumerate(outs):
        if not isinstance(o, Tensor):
            raise TypeError(f"tp.save_model: output {i} of the traced function is a "
                            f"{type(o).__name__}; a model returns a Tensor or a tuple of Tensors")
    graph, tensors, _ = build_graph(outs, cut_realized=False)
    canon, _, args = graph.canonical()
    by_input = {id(x): n for x, n in zip(xs, input_names)}
    names: dict[str, str] = {}
    values: dict[str, np.ndarray] = {}
    for k, tid in enumerate(args):
        t = tensors[tid]
        if id(t) in by_input:
            names[f"arg{k}"] = f"input:{by_input[id(t)]}"
            continue
        pname = param_names.get(id(t), f"const:{len(values)}")
        if pname.startswith("const:"):
            vname = pname
        else:
            vname, pname = pname, f"param:{pname}"
        names[f"arg{k}"] = pname
        values[vname] = np.asarray(t.numpy())
    nodes = {}
    for nid, n in canon.nodes.items():
        if n.op == "input":
            n = n.replace(attrs=Attrs({**n.attrs, "tensor": names[n.attrs["tensor"]]}))
        nodes[nid] = n
    return Graph(nodes, canon.outputs), values, len(outs)


def with_batch(arrays: Sequence[np.ndarray], extra: int) -> list[np.ndarray]:
    """The arrays with ``extra`` more rows (copies of the first) along dimension 0."""
    return [np.concatenate([a, np.repeat(a[:1], extra, axis=0)]) for a in arrays]


def batch_rules(g: Sequence[Graph], batch: int) -> tuple[list[BatchRule] | None, str]:
    """Rules making the graph ``g[0]`` (traced at ``batch``) fit any batch, from ``g[1]``
    and ``g[2]`` (traced at ``batch + 1`` and ``batch + 2``); ``(None, reason)`` when the
    graphs differ in another way than affine integer attributes."""
    g0, g1, g2 = g
    if list(g0.nodes) != list(g1.nodes) or list(g0.nodes) != list(g2.nodes) or g0.outputs != g1.outputs:
        return None, "its graph has another structure at another batch size"
    rules: list[BatchRule] = []
    for nid, n0 in g0.nodes.items():
        n1, n2 = g1.nodes[nid], g2.nodes[nid]
        if (n0.op, n0.inputs, n0.dtype) != (n1.op, n1.inputs, n1.dtype) or \
                (n0.op, n0.inputs, n0.dtype) != (n2.op, n2.inputs, n2.dtype):
            return None, f"node {nid} ({n0.op}) differs at another batch size"
        if n0.op == "input":
            if n0.attrs["tensor"].startswith("input:"):
                continue
            if n0.attrs != n1.attrs or n0.attrs != n2.attrs:
                return None, f"the value {n0.attrs['tensor']!r} it reads depends on the batch size"
            continue
        if set(n0.attrs) != set(n1.attrs) or set(n0.attrs) != set(n2.attrs):
            return None, f"node {nid} ({n0.op}) has other attributes at another batch size"
        for attr in n0.attrs:
            why = _diff(n0.attrs[attr], n1.attrs[attr], n2.attrs[attr], batch, nid, attr, [], rules)
            if why:
                return None, f"node {nid} ({n0.op}) attribute {attr!r} {why}"
    return rules, ""


def _diff(v0: Any, v1: Any, v2: Any, batch: int, nid: str, attr: str, path: list[int | str],
          rules: list[BatchRule]) -> str:
    if _is_int(v0) and _is_int(v1) and _is_int(v2):
        if v0 != v1 or v0 != v2:
            scale = v1 - v0
            offset = v0 - scale * batch
            if scale * (batch + 2) + offset != v2:
                return f"does not grow linearly with the batch ({v0}, {v1}, {v2})"
            rules.append({"node": nid, "attr": attr, "path": list(path), "scale": scale, "offset": offset})
        return ""
    if isinstance(v0, tuple) and isinstance(v1, tuple) and isinstance(v2, tuple):
        if not len(v0) == len(v1) == len(v2):
            return "changes length with the batch size"
        for i, (a, b, c) in enumerate(zip(v0, v1, v2)):
            why = _diff(a, b, c, batch, nid, attr, [*path, i], rules)
            if why:
                return why
        return ""
    if isinstance(v0, Mapping) and isinstance(v1, Mapping) and isinstance(v2, Mapping):
        if not set(v0) == set(v1) == set(v2):
            return "changes keys with the batch size"
        for k in v0:
            why = _diff(v0[k], v1[k], v2[k], batch, nid, attr, [*path, k], rules)
            if why:
                return why
        return ""
    return "" if v0 == v1 == v2 else "changes with the batch size"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def apply_rules(graph: Graph, rules: Sequence[BatchRule], batch: int) -> dict[str, dict[str, Any]]:
    """node id -> its attributes changed for ``batch`` (only the nodes a rule touches)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rules:
        node: Node = graph.nodes[r["node"]]
        attrs = out.setdefault(r["node"], dict(node.attrs))
        attrs[r["attr"]] = _set(attrs[r["attr"]], list(r["path"]), r["scale"] * batch + r["offset"])
    return out


def _set(v: Any, path: list[Any], value: int) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(v, tuple):
        return tuple(_set(x, rest, value) if i == head else x for i, x in enumerate(v))
    return {k: (_set(x, rest, value) if k == head else x) for k, x in v.items()}
