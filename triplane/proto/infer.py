"""Shape and dtype inference by the op table: of one node (:func:`infer_node`, which the
SDK records with and ``proto/vectors/shapes/`` pins for the other SDKs), and of a graph
document as a client sends it (:func:`graph_from_wire`).

On the wire a node may leave out ``shape`` and ``dtype`` (both, or either): they are
inferred from its inputs, in topological order. A node may carry ``loc``, the source
location its SDK recorded it at (``"train.go:42"``); it is dropped from the graph (it is
no part of the graph's hash) and kept only to name in errors. An ``input`` node may leave
out its ``shape``/``dtype`` attributes when the caller can say the type of the tensor it
binds (``bound``: the scheduler knows its uploads and refs).

Failure semantics: the first node whose inference fails raises the op table's GraphError
(its ``kind`` says what: ``shape``, ``dtype``, ``attr``, ``unknown_op``, ``limit``,
``graph`` for arity), located at the node and op, with the input types in the message and
the node's ``loc`` as ``where`` (``node 'y' (matmul): inner dimensions differ: ...; inputs
float32[2, 3], float32[4, 5] (at train.go:42)``). A declared type the op does not give is
a ShapeError / DTypeError the same way. :func:`triplane.proto.validate.validate` still
checks the completed graph (limits, normalised attributes) as it checks any graph.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import DTypeError, GraphError, LimitError, ShapeError
from triplane.proto.ir import Attrs, Graph, Node, TensorType
from triplane.proto.limits import MAX_RANK

__all__ = ["MAX_LOC_LENGTH", "BoundTypes", "add_locs", "graph_from_wire", "infer_node", "type_of", "wire_loc"]

MAX_LOC_LENGTH = 256

_BAD_LOC_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

BoundTypes = Callable[[str], TensorType | None]
"""The type of the tensor an ``input`` node binds (an upload id or a ref), None if unknown."""


def infer_node(op: str, inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> tuple[Attrs, TensorType]:
    """``op``'s normalised attributes and result type on inputs of ``inputs``' types.
    Raises the op table's GraphError (located at the op, not at a node)."""
    opdef = optable.get(op)
    a = opdef.normalise_attrs(attrs)
    t = opdef.check(inputs, a)
    if t.ndim > MAX_RANK:
        raise LimitError(f"the result would have {t.ndim} dimensions, more than the limit of {MAX_RANK}",
                         op=op)
    return a, t


def graph_from_wire(doc: Any, *, max_nodes: int | None = None, bound: BoundTypes | None = None,
                    locs: dict[str, str] | None = None) -> Graph:
    """:meth:`Graph.from_dict` of a submitted document whose nodes may leave out their
    types and carry ``loc`` (see the module doc). A document with every type given and no
    ``loc`` is parsed exactly as ``Graph.from_dict`` parses it (nothing more is done).
    ``locs``, when given, is filled with node id -> ``loc`` of the nodes that carry one
    (the scheduler names them in a failed task's error)."""
    nodes = doc.get("nodes") if isinstance(doc, Mapping) else None
    if not isinstance(nodes, Mapping) or not _incomplete(nodes, bound is not None):
        return Graph.from_dict(doc, max_nodes=max_nodes)
    if locs is None:
        locs = {}
    given: dict[str, tuple[bool, bool]] = {}  # node -> (shape given, dtype given)
    stripped: dict[Any, Any] = {}
    for nid, nd in nodes.items():
        if isinstance(nd, Mapping) and isinstance(nid, str):
            nd = dict(nd)
            loc = nd.pop("loc", None)
            if loc is not None:
                locs[nid] = _check_loc(nid, nd.get("op"), loc)
            given[nid] = ("shape" in nd, "dtype" in nd)
            nd.setdefault("shape", [])
            nd.setdefault("dtype", "float32")
            if bound is not None and nd.get("op") == "input":
                nd = _bind_input(nid, nd, bound, locs.get(nid))
        stripped[nid] = nd
    try:
        graph = Graph.from_dict({**doc, "nodes": stripped}, max_nodes=max_nodes)
    except GraphError as e:
        raise e.at(where=locs.get(e.node)) if e.node is not None else e from None
    types: dict[str, TensorType] = {}
    out: dict[str, Node] = {}
    for nid, node in graph.nodes.items():  # in topological order (from_dict sorts)
        ins = [types[i] for i in node.inputs]
        try:
            _, t = infer_node(node.op, ins, node.attrs)
            shape_given, dtype_given = given.get(nid, (True, True))
            if shape_given and tuple(node.shape) != t.shape:
                raise ShapeError(f"declared shape {list(node.shape)} but the op gives {list(t.shape)}")
            if dtype_given and node.dtype != t.dtype.name:
                raise DTypeError(f"declared dtype {node.dtype} but the op gives {t.dtype.name}")
        except GraphError as e:
            raise _located(e, nid, node.op, ins, locs.get(nid)) from None
        types[nid] = t
        out[nid] = node if node.type == t else node.replace(shape=t.shape, dtype=t.dtype.name)
    result = Graph(out, graph.outputs, graph.version)
    result._cache["topo"] = list(out)
    return result


def _incomplete(nodes: Mapping[Any, Any], binds: bool) -> bool:
    for nd in nodes.values():
        if not isinstance(nd, Mapping):
            continue
        if "loc" in nd or "shape" not in nd or "dtype" not in nd:
            return True
        if binds and nd.get("op") == "input":
            attrs = nd.get("attrs")
            if isinstance(attrs, Mapping) and "shape" not in attrs:
                return True
    return False


def wire_loc(where: str) -> str | None:
    """A source location as a node's ``loc`` may carry it: clipped to its last
    ``MAX_LOC_LENGTH`` characters (the file's name and the line are at the end); None for
    an empty one or one with a control character."""
    loc = where if len(where) <= MAX_LOC_LENGTH else "…" + where[-(MAX_LOC_LENGTH - 1):]
    return loc if loc and not _BAD_LOC_CHAR.search(loc) else None


def add_locs(nodes: dict[str, Any], wheres: Iterable[tuple[str, str | None]]) -> None:
    """Give the computed nodes of a wire document's ``nodes`` the source location each was
    made at (``wheres``: node id, location or None), as ``loc`` (:func:`wire_loc`); input
    nodes, nodes that have one and unknown ids are left as they are. An SDK calls it for
    a graph it sends: the scheduler names the ``loc`` in a failed task's error."""
    for nid, where in wheres:
        nd = nodes.get(nid)
        if where is not None and nd is not None and nd.get("op") != "input" and "loc" not in nd:
            loc = wire_loc(where)
            if loc is not None:
                nd["loc"] = loc


def _check_loc(nid: str, op: Any, loc: Any) -> str:
    where = op if isinstance(op, str) else None
    if not isinstance(loc, str) or not 0 < len(loc) <= MAX_LOC_LENGTH or _BAD_LOC_CHAR.search(loc):
        raise GraphError(f"'loc' must be a source location of 1..{MAX_LOC_LENGTH} characters, "
                         f"no control characters (e.g. \"train.go:42\"), got {ascii(loc)[:60]}",
                         node=nid, op=where)
    return loc


def _bind_input(nid: str, nd: dict[str, Any], bound: BoundTypes, loc: str | None) -> dict[str, Any]:
    """An ``input`` node without a ``shape`` attribute takes its tensor's type."""
    attrs = nd.get("attrs")
    if not isinstance(attrs, Mapping) or "shape" in attrs:
        return nd
    tensor = attrs.get("tensor")
    t = bound(tensor) if isinstance(tensor, str) else None
    if t is None:
        raise GraphError(f"tensor {str(tensor)[:60]!r} is not a known upload or ref, and the node "
                         "gives no 'shape' attribute to type it by", node=nid, op="input", where=loc)
    dtype = attrs.get("dtype", t.dtype.name)
    return {**nd, "attrs": {**attrs, "shape": list(t.shape), "dtype": dtype}}


def _located(e: GraphError, nid: str, op: str, ins: Sequence[TensorType], loc: str | None) -> GraphError:
    if ins:
        e.reason = f"{e.reason}; inputs {', '.join(str(t) for t in ins)}"
    return e.at(node=nid, op=op, where=loc)


def type_of(shape: Sequence[int], dtype: str) -> TensorType:
    """A TensorType from a stored shape and dtype name (an upload's, a ref's)."""
    return TensorType(tuple(shape), dt.dtype(dtype))
