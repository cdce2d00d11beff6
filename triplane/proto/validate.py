"""The one place a graph is checked: against the op table, and at the front door.

``validate`` never trusts the declared shapes and dtypes: it re-infers every node from
its inputs and rejects the graph at the first node that disagrees, naming the node, the
op and what is wrong. No tensor may have more than ``MAX_RANK`` dimensions.

``check_submission`` checks what a client submits before anything else reads it: node
ids and fetched names must be names a result can be fetched by (``check_id``), declared
shapes within ``MAX_RANK``; ``loads_json`` parses a request body refusing duplicate keys
and NaN/Infinity. Each raises a ``GraphError`` naming the node or field, with the
offending text escaped (a lone surrogate or a control character never reaches a log or a
response as such).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.canonjson import refuse_constants, refuse_duplicate_keys
from triplane.proto.errors import DTypeError, GraphError, LimitError, ShapeError
from triplane.proto.ir import Graph, Node, TensorType
from triplane.proto.limits import MAX_ID_LENGTH, MAX_RANK


@dataclass(frozen=True)
class Limits:
    """Size bounds a graph must keep (the scheduler applies its configured ones)."""

    max_nodes: int = 1_000_000
    max_elements: int = 1 << 40       # per tensor
    max_constant_bytes: int = 1 << 20  # inline data in one 'constant' node
    max_inputs: int = 4096             # per node (concat/stack)


DEFAULT_LIMITS = Limits()


def validate(graph: Graph, limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Check ``graph`` and return it with nodes in topological order and attributes
    normalised by the op table (defaults filled in).

    Raises a GraphError subclass naming the node and op: UnknownOpError, AttrError,
    ShapeError / DTypeError (inference fails, or disagrees with the declared type),
    LimitError (nodes, elements per tensor, inline constant bytes, inputs per node), and
    GraphError itself for dangling inputs, cycles, wrong arity and missing outputs."""
    if len(graph.nodes) > limits.max_nodes:
        raise LimitError(f"graph has {len(graph.nodes)} nodes, more than the limit of {limits.max_nodes}")
    if not graph.outputs:
        raise GraphError("graph has no outputs")
    for o in graph.outputs:
        if o not in graph.nodes:
            raise GraphError(f"output {o!r} is not a node of the graph")
    order = graph.topo_order()  # raises on dangling inputs and cycles
    types: dict[str, TensorType] = {}
    out_nodes: dict[str, Node] = {}
    for nid in order:
        node = graph.nodes[nid]
        try:
            out_nodes[nid] = _check_node(node, types, limits)
        except GraphError as e:
            raise e.at(node=nid, op=node.op) from None
        types[nid] = out_nodes[nid].type
    out = Graph(out_nodes, graph.outputs, graph.version)
    out._cache["topo"] = order  # its nodes are stored in this order: the passes reuse it
    return out


def _check_node(node: Node, types: dict[str, TensorType], limits: Limits) -> Node:
    opdef = optable.get(node.op)
    if len(node.shape) > MAX_RANK:
        raise LimitError(f"shape {list(node.shape)} has {len(node.shape)} dimensions, more than "
                         f"the limit of {MAX_RANK}")
    if len(node.inputs) > limits.max_inputs:
        raise LimitError(f"{len(node.inputs)} inputs, more than the limit of {limits.max_inputs}")
    attrs = opdef.normalise_attrs(node.attrs)
    if node.op == "constant":
        # Bound the inline data before inference decodes it.
        declared = math.prod(attrs["shape"]) * dt.dtype(attrs["dtype"]).itemsize
        if max(declared, len(attrs["data"]) * 3 // 4) > limits.max_constant_bytes:
            raise LimitError(f"inline constant of {declared} bytes, more than the limit of "
                             f"{limits.max_constant_bytes} (upload it as a tensor instead)")
    inferred = opdef.check([types[i] for i in node.inputs], attrs)
    if inferred.ndim > MAX_RANK:
        raise LimitError(f"the op gives {inferred.ndim} dimensions, more than the limit of {MAX_RANK}")
    if inferred.size > limits.max_elements:
        raise LimitError(f"tensor of shape {inferred.shape} has {inferred.size} elements, more than "
                         f"the limit of {limits.max_elements}")
    if node.op == "constant" and inferred.nbytes > limits.max_constant_bytes:
        raise LimitError(f"inline constant of {inferred.nbytes} bytes, more than the limit of "
                         f"{limits.max_constant_bytes} (upload it as a tensor instead)")
    if tuple(node.shape) != inferred.shape:
        raise ShapeError(f"declared shape {list(node.shape)} but the op gives {list(inferred.shape)}")
    if node.dtype != inferred.dtype.name:
        raise DTypeError(f"declared dtype {node.dtype} but the op gives {inferred.dtype.name}")
    return node if attrs == node.attrs else node.replace(attrs=attrs)


# --- the front door: what a client submits ---------------------------------------------------

# Control characters (C0, DEL, C1), '/' (a fetched name is one URL path segment) and lone
# surrogates (UTF-8 cannot carry them: the response naming them could not be written).
_BAD_ID_CHAR = re.compile("[\x00-\x1f\x7f-\x9f/\ud800-\udfff]")
_BAD_TEXT_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def shown(text: str, limit: int = 80) -> str:
    """``text`` safe to put in a message or a JSON response: non-ASCII and control
    characters escaped, cut at ``limit`` characters."""
    return ascii(text[:limit])[1:-1] + ("..." if len(text) > limit else "")


def check_id(value: Any, what: str = "node id") -> str:
    """``value`` if it can name a node and be fetched back by that name
    (``GET /v1/jobs/{id}/tensors/{name}``): a non-empty string of at most
    ``MAX_ID_LENGTH`` characters, no ``/``, no control character (NUL included), no lone
    surrogate, not ``.`` or ``..``. GraphError (LimitError for the length) otherwise,
    naming ``what`` and the escaped value."""
    if not isinstance(value, str):
        raise GraphError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise GraphError(f"{what} is empty")
    if len(value) > MAX_ID_LENGTH:
        raise _named(LimitError(f"{what} '{shown(value, 40)}' is {len(value)} characters long, more "
                                f"than the limit of {MAX_ID_LENGTH}"), shown(value, 40))
    bad = _BAD_ID_CHAR.search(value)
    if bad is not None or value in (".", ".."):
        c = bad.group() if bad is not None else value
        why = ("'/'" if c == "/"
               else f"a lone surrogate (U+{ord(c):04X})" if "\ud800" <= c <= "\udfff"
               else f"a control character (U+{ord(c):04X})" if len(c) == 1
               else "a path step ('.' or '..')")
        raise _named(GraphError(f"{what} '{shown(value)}' holds {why}, which an id may not: results "
                                "are fetched by id, as one URL path segment"), shown(value))
    return value


def _named(e: GraphError, node: str) -> GraphError:
    # The node field of the error body, without repeating the (escaped) id in the message.
    e.node = node
    return e


def check_submission(graph_doc: Any, fetch: Any) -> None:
    """Check the ids and declared ranks of a graph document as submitted, and the fetched
    names, before the document is parsed into a :class:`Graph` (which checks the rest).
    Anything that is not even shaped like a graph document is left to ``Graph.from_dict``."""
    if isinstance(graph_doc, Mapping):
        nodes = graph_doc.get("nodes")
        if isinstance(nodes, Mapping):
            _check_ids(nodes, "node id")
            ops: dict[str, str] = {}
            for nid, nd in nodes.items():
                if not isinstance(nd, Mapping):
                    continue
                op = nd.get("op")
                if isinstance(op, str):
                    ops.setdefault(op, nid)
                shape = nd.get("shape")
                if isinstance(shape, (list, tuple)) and len(shape) > MAX_RANK:
                    raise LimitError(f"shape has {len(shape)} dimensions, more than the limit of "
                                     f"{MAX_RANK}", node=nid, op=op if isinstance(op, str) else None)
            for op, nid in ops.items():
                if _BAD_TEXT_CHAR.search(op):
                    raise GraphError(f"op name '{shown(op)}' holds a control character or a lone "
                                     "surrogate", node=nid, op=shown(op))
        outputs = graph_doc.get("outputs")
        if isinstance(outputs, (list, tuple)):
            _check_ids(outputs, "outputs[{i}]")
    if isinstance(fetch, (list, tuple)):
        _check_ids(fetch, "fetch[{i}]")


def _check_ids(ids: Any, what: str) -> None:
    # One regex pass over all the ids at once (a graph may hold 10^6); the slow path, id
    # by id, only finds and names the culprit.
    plain = all(type(i) is str and 0 < len(i) <= MAX_ID_LENGTH and i not in (".", "..") for i in ids)
    if plain and _BAD_ID_CHAR.search("".join(ids)) is None:
        return
    for i, value in enumerate(ids):
        check_id(value, what.format(i=i))


_DOCUMENT_KEYS = refuse_duplicate_keys("the JSON document")
_DOCUMENT_CONSTANTS = refuse_constants("the JSON document")


try:  # the C parser of the fast path below (a declared dependency; the stdlib alone also works)
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson = None  # type: ignore[assignment]

# a key followed by a space before its colon; 19 digits in a row (orjson reads an integer
# beyond 64 bits as a float, the stdlib as an int: such bodies take the strict parser)
_FAST_REFUSED = re.compile(rb'"[ \t\r\n]+:|[0-9]{19}')


def loads_json(data: bytes | bytearray | str) -> Any:
    """Parse a request body as strict JSON: a duplicate key at any level, NaN or Infinity
    is a GraphError; anything else malformed is a ValueError (or RecursionError)."""
    if _orjson is not None and type(data) is bytes and b"\\" not in data:
        doc = _strict_fast(data)
        if doc is not None:
            return doc
    return json.loads(data, object_pairs_hook=_DOCUMENT_KEYS, parse_constant=_DOCUMENT_CONSTANTS)


def _strict_fast(data: bytes) -> Any:
    """The document of a body holding no backslash, parsed in C, or None (then the strict
    parser decides). Without a backslash no string holds a quote, so every ``"`` followed
    by ``:`` closes a key: the body's count of ``":`` (when no key is followed by a space
    first) is its number of members, and the count in the compact re-encoding of what was
    parsed is the number kept. They differ exactly when a key repeats in one object.
    orjson refuses NaN and Infinity; anything else it refuses (not JSON, not UTF-8,
    nesting beyond its limit) goes to the strict parser too."""
    try:
        doc = _orjson.loads(data)
        kept = _orjson.dumps(doc).count(b'":')
    except (ValueError, TypeError, RecursionError):
        return None
    if kept != data.count(b'":') or _FAST_REFUSED.search(data) is not None:
        return None
    return doc
