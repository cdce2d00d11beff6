"""The one place a graph is checked against the op table.

``validate`` never trusts the declared shapes and dtypes: it re-infers every node from
its inputs and rejects the graph at the first node that disagrees, naming the node, the
op and what is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import DTypeError, GraphError, LimitError, ShapeError
from triplane.proto.ir import Graph, Node, TensorType


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
