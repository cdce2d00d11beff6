"""The graph IR: plain, typed, immutable data.

A :class:`Graph` maps node ids to :class:`Node` s and names its outputs. A node is one op
applied to the outputs of other nodes (by id) with attributes, and carries the shape and
dtype the op table infers for it. The same graph serialises to the same canonical JSON
bytes in every language (RFC 8785 style: sorted keys, no whitespace, ECMAScript number
form), so :meth:`Graph.hash` names it.

Construction does not validate; :func:`triplane.proto.validate.validate` is the one place
that checks a graph against the op table.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml

from triplane.proto import dtypes as dt
from triplane.proto.errors import GraphError, LimitError
from triplane.proto.safeyaml import YamlRefused, bounded_load

IR_VERSION = 1


class TensorType(NamedTuple):
    """The static type of a value: shape and dtype."""

    shape: tuple[int, ...]
    dtype: dt.DType

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.name}{list(self.shape)}"


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute mapping. Values are frozen: lists become tuples,
    dicts become Attrs, numpy scalars become Python scalars."""

    __slots__ = ("_d", "_h")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        src = items.items() if isinstance(items, Mapping) else items
        d: dict[str, Any] = {}
        for k, v in src:
            if not isinstance(k, str):
                raise GraphError(f"attribute names are strings, got {type(k).__name__} {k!r}")
            d[_text(k)] = freeze(v)
        self._d = d
        self._h: int | None = None

    @classmethod
    def frozen(cls, d: dict[str, Any]) -> Attrs:
        """Wrap ``d`` whose keys are str and values already frozen (the op table's
        normalised values are), skipping the per-value copy."""
        a = cls.__new__(cls)
        a._d = d
        a._h = None
        return a

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    # The Mapping mixins would go through __getitem__ per key; the dict's views are direct.
    def items(self) -> Any:
        return self._d.items()

    def keys(self) -> Any:
        return self._d.keys()

    def values(self) -> Any:
        return self._d.values()

    def get(self, key: str, default: Any = None) -> Any:
        return self._d.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(tuple(sorted(self._d.items(), key=lambda kv: kv[0])))
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._d == other._d
        if isinstance(other, Mapping):
            return self._d == {k: freeze(v) for k, v in other.items()}
        return NotImplemented

    def __repr__(self) -> str:
        return f"Attrs({self._d!r})"

    def replace(self, **changes: Any) -> Attrs:
        return Attrs({**self._d, **changes})


EMPTY_ATTRS = Attrs()


def freeze(v: Any) -> Any:
    """A hashable, canonical copy of an attribute value."""
    # Exact builtin types first: a graph of 10^4 nodes freezes ~10^5 values on submit, and
    # the isinstance chain below (for subclasses, numpy scalars, mappings) costs 4x more.
    t = type(v)
    if t is float:
        return v + 0.0  # no negative zero: see below
    if t is int or t is bool or v is None:
        return v
    if t is str:
        return v if v.isascii() else _text(v)
    if t is list or t is tuple:
        return tuple([freeze(x) for x in v])
    if v is None or isinstance(v, (bool, Attrs)):
        return v
    if isinstance(v, str):
        return _text(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        # The wire has no negative zero (canonical JSON writes -0.0 as 0), so neither does
        # a graph: otherwise a graph and its round trip would differ.
        return float(v) + 0.0
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, Mapping):
        return Attrs(v)
    if isinstance(v, dt.DType):
        return v.name
    item = getattr(v, "item", None)  # numpy scalar
    if callable(item) and getattr(v, "shape", None) == ():
        return freeze(item())
    raise GraphError(f"attribute value {v!r} of type {type(v).__name__} cannot go in a graph")


def _text(s: str) -> str:
    """``s`` if it is valid Unicode (no lone surrogates, which UTF-8 cannot carry)."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise GraphError(f"string {s!r} is not valid Unicode (lone surrogate)") from None
    return s


def _check_wire_value(v: Any, where: str) -> None:
    """Reject what canonical JSON cannot carry anywhere in a (frozen) attribute value: NaN,
    infinities and integers beyond 2**53, so a graph that parses can be hashed and sent."""
    t = type(v)
    if t is float:
        if math.isfinite(v):
            return
    elif t is str or t is bool or v is None:
        return
    if isinstance(v, int) and not isinstance(v, bool):
        if abs(v) > MAX_SAFE_INT:
            raise GraphError(f"attribute {where} holds the integer {v}, beyond +-2**53")
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise GraphError(f"attribute {where} holds {v!r}; NaN and infinities cannot go in "
                             "a graph document (use a 'constant' node)")
    elif isinstance(v, tuple):
        for x in v:
            _check_wire_value(x, where)
    elif isinstance(v, Attrs):
        for k, x in v.items():
            _check_wire_value(x, f"{where}.{k}")


def fits_json(x: float) -> bool:
    """Whether float ``x`` survives canonical JSON unchanged: not NaN, not infinite, not
    -0.0 (written as 0). Scalars that do not fit travel as ``constant`` nodes instead."""
    return math.isfinite(x) and not (x == 0 and math.copysign(1.0, x) < 0)


def encode_data(value: Any) -> str:
    """The ``data`` attribute of a ``constant`` node holding array ``value``: its
    little-endian bytes in row-major order, base64."""
    import numpy as np

    arr = np.asarray(value)
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return base64.b64encode(arr.tobytes()).decode("ascii")


_SCALARS = (str, int, float, bool, type(None))


def thaw(v: Any) -> Any:
    """The JSON-ready form of a frozen attribute value."""
    t = type(v)
    if t in _SCALARS:
        return v
    if t is tuple:
        return [x if type(x) in _SCALARS else thaw(x) for x in v]
    if t is Attrs:
        return {k: x if type(x) in _SCALARS else thaw(x) for k, x in v._d.items()}
    return v


@dataclass(frozen=True, slots=True)
class Node:
    op: str
    inputs: tuple[str, ...] = ()
    attrs: Attrs = EMPTY_ATTRS
    shape: tuple[int, ...] = ()
    dtype: str = "float32"

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, dt.BY_NAME[self.dtype])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "shape": list(self.shape), "dtype": self.dtype}
        if self.inputs:
            d["inputs"] = list(self.inputs)
        if self.attrs:
            d["attrs"] = thaw(self.attrs)
        return d

    def replace(self, **changes: Any) -> Node:
        fields = {"op": self.op, "inputs": self.inputs, "attrs": self.attrs,
                  "shape": self.shape, "dtype": self.dtype, **changes}
        if not isinstance(fields["attrs"], Attrs):
            fields["attrs"] = Attrs(fields["attrs"])
        fields["inputs"] = tuple(fields["inputs"])
        fields["shape"] = tuple(fields["shape"])
        return Node(**fields)


@dataclass(frozen=True)
class Graph:
    """Node ids -> nodes (in a topological order once validated), and the output ids."""

    nodes: Mapping[str, Node]
    outputs: tuple[str, ...]
    version: int = IR_VERSION
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node_id: str) -> Node:
        return self.nodes[node_id]

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.nodes

    def type_of(self, node_id: str) -> TensorType:
        return self.nodes[node_id].type

    # --- structure -------------------------------------------------------------------

    def consumers(self) -> dict[str, list[str]]:
        """node id -> ids of the nodes that read it (each consumer listed once per use)."""
        if "consumers" not in self._cache:
            users: dict[str, list[str]] = {k: [] for k in self.nodes}
            for nid, node in self.nodes.items():
                for i in node.inputs:
                    if i in users:
                        users[i].append(nid)
            self._cache["consumers"] = users
        return self._cache["consumers"]

    def topo_order(self) -> list[str]:
        """A topological order: inputs before their consumers, otherwise the stored order.
        Raises GraphError on a cycle or a dangling input."""
        if "topo" not in self._cache:
            self._cache["topo"] = self._dfs(self.nodes)
        return self._cache["topo"]

    def dataflow_order(self) -> list[str]:
        """A topological order that depends only on the graph's structure, not on node ids
        or the order nodes were stored in: depth-first from the outputs (in order), each
        node's inputs in order; nodes no output reads follow, started from in id order
        (so only for them do ids matter). Canonical renaming (plan cache keys,
        :meth:`structure_hash`) uses it."""
        if "dataflow" not in self._cache:
            self._cache["dataflow"] = self._dfs([*self.outputs, *sorted(self.nodes)])
        return self._cache["dataflow"]

    def _dfs(self, roots: Iterable[str]) -> list[str]:
        order: list[str] = []
        state: dict[str, int] = {}  # 1 = on the stack, 2 = done
        for root in roots:
            if root in state:
                continue
            if root not in self.nodes:
                raise GraphError(f"output {root!r} is not a node of the graph")
            stack: list[tuple[str, int]] = [(root, 0)]
            state[root] = 1
            while stack:
                nid, i = stack[-1]
                ins = self.nodes[nid].inputs
                if i < len(ins):
                    stack[-1] = (nid, i + 1)
                    dep = ins[i]
                    if dep not in self.nodes:
                        raise GraphError(f"input {dep!r} is not a node of the graph",
                                         node=nid, op=self.nodes[nid].op)
                    s = state.get(dep)
                    if s == 1:
                        raise GraphError(f"cycle through {dep!r}", node=nid, op=self.nodes[nid].op)
                    if s is None:
                        state[dep] = 1
                        stack.append((dep, 0))
                else:
                    stack.pop()
                    state[nid] = 2
                    order.append(nid)
        return order

    def sorted(self) -> Graph:
        """The same graph with its nodes stored in topological order."""
        order = self.topo_order()
        if list(self.nodes) == order:
            return self
        return Graph({k: self.nodes[k] for k in order}, self.outputs, self.version)

    # --- serialisation ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version,
                "nodes": {k: n.to_dict() for k, n in self.nodes.items()},
                "outputs": list(self.outputs)}

    @classmethod
    def from_dict(cls, d: Any, *, max_nodes: int | None = None) -> Graph:
        """Build a graph from its dict form, checking the structure (not the op table).
        Anything malformed raises GraphError (never KeyError/TypeError)."""
        try:
            return cls._from_dict(d, max_nodes)
        except RecursionError:
            raise GraphError("graph document is nested too deeply") from None

    @classmethod
    def _from_dict(cls, d: Any, max_nodes: int | None) -> Graph:
        if not isinstance(d, Mapping):
            raise GraphError(f"a graph is a mapping with 'nodes' and 'outputs', got {type(d).__name__}")
        unknown = set(d) - {"version", "nodes", "outputs"}
        if unknown:
            raise GraphError(f"unknown graph field(s) {sorted(map(str, unknown))}")
        version = d.get("version", IR_VERSION)
        if not _is_int(version) or version != IR_VERSION:
            raise GraphError(f"unsupported graph version {version!r} (this build reads {IR_VERSION})")
        nodes_in = d.get("nodes")
        if not isinstance(nodes_in, Mapping):
            raise GraphError("'nodes' must be a mapping of node id -> node")
        limit = max_nodes if max_nodes is not None else DEFAULT_MAX_NODES
        if len(nodes_in) > limit:
            raise LimitError(f"graph has {len(nodes_in)} nodes, more than the limit of {limit}")
        nodes = {}
        for nid, nd in nodes_in.items():
            if not isinstance(nid, str):
                raise GraphError(f"node ids are strings, got {type(nid).__name__} {nid!r}")
            nodes[_text(nid)] = _node_from_dict(nid, nd)
        outputs = d.get("outputs")
        if not isinstance(outputs, (list, tuple)) or not all(isinstance(o, str) for o in outputs):
            raise GraphError(f"'outputs' must be a list of node ids, got {outputs!r}")
        for o in outputs:
            if o not in nodes:
                raise GraphError(f"output {o!r} is not a node of the graph")
        return cls(nodes, tuple(outputs), version).sorted()

    def to_json(self) -> bytes:
        """Canonical JSON bytes: same graph, same bytes, in any language."""
        if "json" not in self._cache:
            self._cache["json"] = _fast_canonical(self._jsonable_doc) or canonical_json(self.to_dict())
        return self._cache["json"]

    def _jsonable_doc(self) -> dict[str, Any]:
        """``to_dict`` built straight in the form the C encoder writes canonically (one
        pass instead of to_dict's copy and then _jsonable's); _SlowPath where it cannot."""
        nodes: dict[str, Any] = {}
        for k, n in self.nodes.items():
            d: dict[str, Any] = {"op": n.op, "shape": _jsonable(n.shape), "dtype": n.dtype}
            if n.inputs:
                d["inputs"] = list(n.inputs)
            if n.attrs:
                d["attrs"] = _jsonable(n.attrs)
            nodes[k] = d
        return {"version": self.version, "nodes": nodes, "outputs": list(self.outputs)}

    @classmethod
    def from_json(cls, data: bytes | str, *, max_bytes: int | None = None,
                  max_nodes: int | None = None) -> Graph:
        """Parse a JSON graph document (strict JSON: no NaN/Infinity, no duplicate keys)."""
        limit = max_bytes if max_bytes is not None else DEFAULT_MAX_GRAPH_BYTES
        size = len(data) if isinstance(data, (bytes, bytearray)) else len(data.encode("utf-8", "replace"))
        if size > limit:
            raise LimitError(f"graph document is {size} bytes, more than the limit of {limit}")
        try:
            d = json.loads(data, parse_constant=_reject_constant, parse_int=_parse_int,
                           object_pairs_hook=_no_duplicates)
        except (ValueError, UnicodeDecodeError) as e:  # GraphError is a ValueError too
            if isinstance(e, GraphError):
                raise
            raise GraphError(f"graph is not valid JSON: {e}") from None
        except RecursionError:
            raise GraphError("graph document is nested too deeply") from None
        return cls.from_dict(d, max_nodes=max_nodes)

    def to_yaml(self) -> str:
        return yaml.dump(self.to_dict(), Dumper=_YamlDumper, sort_keys=True, default_flow_style=None)

    @classmethod
    def from_yaml(cls, text: str | bytes, *, max_bytes: int | None = None) -> Graph:
        """Parse a YAML graph document with the safe loader. Aliases are refused: a graph
        never needs them, and they let a small document expand exponentially."""
        limit = max_bytes if max_bytes is not None else DEFAULT_MAX_GRAPH_BYTES
        if len(text) > limit:
            raise LimitError(f"graph document is {len(text)} bytes, more than the limit of {limit}")
        try:
            d = bounded_load(text if isinstance(text, str) else text.decode("utf-8"),
                             max_depth=MAX_YAML_DEPTH)
        except YamlRefused as e:
            raise GraphError(f"graph YAML {e}") from None
        except UnicodeDecodeError as e:
            raise GraphError(f"graph YAML is not UTF-8: {e.reason} at byte {e.start}") from None
        except yaml.YAMLError as e:
            raise GraphError(f"graph is not valid YAML: {e}") from None
        except RecursionError:
            raise GraphError("graph document is nested too deeply") from None
        return cls.from_dict(d)

    def hash(self) -> str:
        """sha256 of the canonical JSON: the graph's name."""
        return hashlib.sha256(self.to_json()).hexdigest()

    def structure_hash(self) -> str:
        """Like :meth:`hash`, but blind to which host tensors the ``input`` nodes bind and to
        node ids: the hash of :meth:`canonical`. Two training steps that differ only in
        parameter values share it, so a compiled plan is reused."""
        if "shash" not in self._cache:
            self._cache["shash"] = self.canonical()[0].hash()
        return self._cache["shash"]

    def canonical(self) -> tuple[Graph, dict[str, str], list[str]]:
        """This graph with nodes renamed ``n0, n1, ...`` in :meth:`dataflow_order` and the
        host tensors its ``input`` nodes bind renamed ``arg0, arg1, ...``. Returns the
        canonical graph, old id -> new id, and the bound tensor ids in argument order.
        Two programs that differ only in names, input values and the order their nodes
        were recorded in canonicalise to the same graph (and so share a cached plan). The
        SDK and the scheduler both canonicalise with this."""
        order = self.dataflow_order()
        rename = {nid: f"n{i}" for i, nid in enumerate(order)}
        args: list[str] = []
        nodes = {}
        for nid in order:
            n = self.nodes[nid]
            attrs = n.attrs
            if n.op == "input":
                attrs = Attrs({**attrs, "tensor": f"arg{len(args)}"})
                args.append(n.attrs["tensor"])
            nodes[rename[nid]] = n.replace(inputs=[rename[i] for i in n.inputs], attrs=attrs)
        g = Graph(nodes, tuple(rename[o] for o in self.outputs), self.version)
        # Stored in dataflow order, which is topological: the order topo_order would compute.
        g._cache["topo"] = list(nodes)
        return g, rename, args


DEFAULT_MAX_NODES = 1_000_000
MAX_YAML_DEPTH = 64  # a graph document nests 6 deep; fused programs a few more
DEFAULT_MAX_GRAPH_BYTES = 256 * 1024 * 1024

_NODE_FIELDS = {"op", "inputs", "attrs", "shape", "dtype"}


def _node_from_dict(nid: str, nd: Any) -> Node:
    if not isinstance(nd, Mapping):
        raise GraphError(f"a node is a mapping, got {type(nd).__name__}", node=nid)
    unknown = set(nd) - _NODE_FIELDS
    if unknown:
        raise GraphError(f"unknown node field(s) {sorted(unknown)}", node=nid)
    op = nd.get("op")
    if not isinstance(op, str):
        raise GraphError("'op' must be a string", node=nid)
    inputs = nd.get("inputs", [])
    if not isinstance(inputs, (list, tuple)) or not all(isinstance(i, str) for i in inputs):
        raise GraphError(f"'inputs' must be a list of node ids, got {inputs!r}", node=nid, op=op)
    attrs = nd.get("attrs", {})
    if not isinstance(attrs, Mapping):
        raise GraphError(f"'attrs' must be a mapping, got {type(attrs).__name__}", node=nid, op=op)
    shape = nd.get("shape")
    if not isinstance(shape, (list, tuple)) or not all(
            _is_int(s) and 0 <= s <= MAX_SAFE_INT for s in shape):
        raise GraphError(f"'shape' must be a list of non-negative integers, got {shape!r}",
                         node=nid, op=op)
    dtype = nd.get("dtype")
    if not isinstance(dtype, str) or dtype not in dt.BY_NAME:
        raise GraphError(f"unknown dtype {dtype!r} (known: {sorted(dt.BY_NAME)})", node=nid, op=op)
    try:
        _text(op)
        frozen = Attrs(attrs)
        for k, v in frozen.items():
            _check_wire_value(v, repr(k))
    except GraphError as e:
        raise e.at(node=nid, op=op) from None
    return Node(op, tuple(_text(i) for i in inputs), frozen, tuple(shape), dtype)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _reject_constant(name: str) -> Any:
    raise GraphError(f"graph JSON holds {name}, which is not JSON (use a 'constant' node)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise GraphError(f"duplicate key {dup!r} in graph JSON")
    return d


# --- canonical JSON (RFC 8785 style) ---------------------------------------------------


MAX_SAFE_INT = 2**53  # JSON numbers are doubles; integers are exact up to here


def _parse_int(text: str) -> int | float:
    # An integer literal beyond 2**53 can only be a double written in ECMAScript's plain
    # form (1e20 is "100000000000000000000"): read it back as that double.
    v = int(text)
    return v if abs(v) <= MAX_SAFE_INT else float(text)


def _fast_canonical(make: Callable[[], Any]) -> bytes | None:
    """Where every float prints the same in Python and ECMAScript, the C json encoder
    writes the canonical bytes -- unless a key holds a character at or above U+E000, where
    code-point order and RFC 8785's UTF-16 order can differ. None where it cannot."""
    try:
        text = json.dumps(make(), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
        if not text or max(text) < "\ue000":
            return text.encode("utf-8")
    except (_SlowPath, UnicodeEncodeError, ValueError, TypeError, RecursionError):
        pass
    return None


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8, ECMAScript number formatting."""
    fast = _fast_canonical(lambda: _jsonable(obj))
    if fast is not None:
        return fast
    out: list[str] = []
    try:
        _emit(obj, out)
        return "".join(out).encode("utf-8")
    except UnicodeEncodeError as e:
        raise GraphError(f"string is not valid Unicode (lone surrogate): {e}") from None
    except RecursionError:
        raise GraphError("value is nested too deeply for canonical JSON") from None


class _SlowPath(Exception):
    pass


def _jsonable(v: Any) -> Any:
    """``v`` with integral floats as ints (ECMAScript prints 2.0 as 2); raises _SlowPath
    for anything the C encoder would write differently from the canonical form."""
    t = type(v)
    if t is str or v is None or t is bool:
        return v
    if t is int:
        if -MAX_SAFE_INT <= v <= MAX_SAFE_INT:
            return v
        raise _SlowPath
    if t is float:
        if v.is_integer():  # ES prints 2.0 as 2; beyond 2**53 it pads shortest digits with 0s
            if abs(v) <= 2.0**53:
                return int(v)
            raise _SlowPath
        if "e" in repr(v) or v != v:  # exponent forms differ; NaN/inf raise on the slow path
            raise _SlowPath
        return v
    if t is Attrs or ((t is dict or isinstance(v, Mapping)) and all(type(k) is str for k in v)):
        return {k: x if type(x) is str else _jsonable(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [x if type(x) is str else _jsonable(x) for x in v]
    raise _SlowPath


def _emit(v: Any, out: list[str]) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        if abs(v) > MAX_SAFE_INT:
            raise GraphError(f"integer {v} is beyond +-2**53: not every SDK can represent it "
                             "exactly (JSON numbers are doubles)")
        out.append(str(int(v)))
    elif isinstance(v, float):
        out.append(es_number(v))
    elif isinstance(v, str):
        out.append(json.dumps(v, ensure_ascii=False))
    elif isinstance(v, Mapping):
        out.append("{")
        # RFC 8785 orders keys by UTF-16 code units.
        for i, k in enumerate(sorted(v, key=lambda s: s.encode("utf-16-be"))):
            if i:
                out.append(",")
            out.append(json.dumps(str(k), ensure_ascii=False))
            out.append(":")
            _emit(v[k], out)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _emit(x, out)
        out.append("]")
    else:
        raise GraphError(f"cannot encode {type(v).__name__} {v!r} in canonical JSON")


def es_number(x: float) -> str:
    """The shortest round-trip decimal of a double, formatted as ECMAScript's
    Number.prototype.toString does (so Go and JS SDKs can match it byte for byte)."""
    if math.isnan(x) or math.isinf(x):
        raise GraphError(f"{x!r} is not representable in JSON (use a constant node)")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    r = repr(abs(x))
    mant, _, exp = r.partition("e")
    point = mant.find(".")
    digits = mant.replace(".", "")
    n = (point if point >= 0 else len(mant)) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        s = digits + "0" * (n - k)
    elif 0 < n <= 21:
        s = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        s = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        es = f"e{'+' if e >= 0 else '-'}{abs(e)}"
        s = digits + es if k == 1 else digits[0] + "." + digits[1:] + es
    return sign + s


# --- YAML with the safe (C where available) loader -------------------------------------

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _YamlDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        return True  # from_yaml refuses aliases, so never write one
