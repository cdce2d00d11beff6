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

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from triplane.proto import dtypes as dt
from triplane.proto.canonjson import (
    canonical_json,
    es_number,
    fast_canonical,
    jsonable,
    loads_strict,
)
from triplane.proto.errors import GraphError, LimitError
from triplane.proto.safeyaml import YamlRefused, bounded_load
from triplane.proto.values import (
    EMPTY_ATTRS,
    MAX_SAFE_INT,
    Attrs,
    TensorType,
    check_text,
    check_wire_value,
    encode_data,
    fits_json,
    freeze,
    thaw,
)

# The IR's public names: the graph, and the value types and encodings it is made of
# (defined in values.py and canonjson.py), so ``triplane.proto.ir`` is the one import.
__all__ = [
    "EMPTY_ATTRS", "IR_VERSION", "Attrs", "Graph", "Node", "TensorType", "canonical_json", "encode_data",
    "es_number", "fits_json", "freeze", "thaw",
]

IR_VERSION = 1


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
            nodes[check_text(nid)] = _node_from_dict(nid, nd)
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
            self._cache["json"] = fast_canonical(self._jsonable_doc) or canonical_json(self.to_dict())
        return self._cache["json"]

    def _jsonable_doc(self) -> dict[str, Any]:
        """``to_dict`` built straight in the form the C encoder writes canonically (one
        pass instead of to_dict's copy and then _jsonable's); SlowPath where it cannot."""
        nodes: dict[str, Any] = {}
        for k, n in self.nodes.items():
            d: dict[str, Any] = {"op": n.op, "shape": jsonable(n.shape), "dtype": n.dtype}
            if n.inputs:
                d["inputs"] = list(n.inputs)
            if n.attrs:
                d["attrs"] = jsonable(n.attrs)
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
            d = loads_strict(data)
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
        check_text(op)
        frozen = Attrs(attrs)
        for k, v in frozen.items():
            check_wire_value(v, repr(k))
    except GraphError as e:
        raise e.at(node=nid, op=op) from None
    return Node(op, tuple(check_text(i) for i in inputs), frozen, tuple(shape), dtype)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --- YAML with the safe (C where available) loader -------------------------------------

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _YamlDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        return True  # from_yaml refuses aliases, so never write one
