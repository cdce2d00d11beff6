"""Appending ops to a graph, with inference at each step.

:class:`Builder` is how passes (autograd above all) and gradient rules write new nodes;
:class:`Ref` is a handle on one node with arithmetic operators, so a gradient rule reads
like the maths: ``g * b.op("cos", x)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.ir import Graph, Node, TensorType, encode_data, fits_json


class Ref:
    """A node of a Builder's graph."""

    __slots__ = ("b", "id", "type")

    def __init__(self, b: Builder, node_id: str, type_: TensorType) -> None:
        self.b, self.id, self.type = b, node_id, type_

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> dt.DType:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.type.shape)

    def __repr__(self) -> str:
        return f"Ref({self.id!r}, {self.type})"

    def _bin(self, op: str, other: Any, swap: bool = False) -> Ref:
        o = self.b.lift(other, self)
        return self.b.op(op, o, self) if swap else self.b.op(op, self, o)

    def __add__(self, o: Any) -> Ref:
        return self._bin("add", o)

    def __radd__(self, o: Any) -> Ref:
        return self._bin("add", o, True)

    def __sub__(self, o: Any) -> Ref:
        return self._bin("sub", o)

    def __rsub__(self, o: Any) -> Ref:
        return self._bin("sub", o, True)

    def __mul__(self, o: Any) -> Ref:
        return self._bin("mul", o)

    def __rmul__(self, o: Any) -> Ref:
        return self._bin("mul", o, True)

    def __truediv__(self, o: Any) -> Ref:
        return self._bin("div", o)

    def __rtruediv__(self, o: Any) -> Ref:
        return self._bin("div", o, True)

    def __neg__(self) -> Ref:
        return self.b.op("neg", self)


class Builder:
    """Appends inferred nodes to a copy of ``nodes``; ids are ``<prefix><n>`` and never
    collide with ids already present."""

    def __init__(self, nodes: Mapping[str, Node] | None = None, prefix: str = "_b") -> None:
        self.nodes: dict[str, Node] = dict(nodes or {})
        self.prefix = prefix
        self._count = 0

    def fresh_id(self) -> str:
        while True:
            self._count += 1
            nid = f"{self.prefix}{self._count}"
            if nid not in self.nodes:
                return nid

    def ref(self, node_id: str) -> Ref:
        return Ref(self, node_id, self.nodes[node_id].type)

    def add_node(self, op: str, inputs: Iterable[Ref], attrs: Mapping[str, Any],
                 node_id: str | None = None) -> Ref:
        opdef = optable.get(op)
        ins = list(inputs)
        a = opdef.normalise_attrs(attrs)
        t = opdef.check([r.type for r in ins], a)
        nid = node_id or self.fresh_id()
        self.nodes[nid] = Node(op, tuple(r.id for r in ins), a, t.shape, t.dtype.name)
        return Ref(self, nid, t)

    def op(self, op: str, *inputs: Ref, **attrs: Any) -> Ref:
        return self.add_node(op, inputs, attrs)

    # --- conveniences for gradient rules -----------------------------------------------

    def const(self, value: float | int | bool, dtype: dt.DType | str,
              shape: tuple[int, ...] = ()) -> Ref:
        d = dt.dtype(dtype)
        if isinstance(value, float) and not fits_json(value):  # NaN, inf, -0.0: inline bytes
            c = self.op("constant", data=encode_data(np.array(value, d.np)), shape=(), dtype=d.name)
            return c if not shape else self.op("broadcast_to", c, shape=tuple(shape))
        return self.op("full", value=value, shape=tuple(shape), dtype=d.name)

    def lift(self, x: Any, like: Ref) -> Ref:
        """A Python scalar becomes a 0-d constant of ``like``'s dtype; a Ref passes."""
        if isinstance(x, Ref):
            return x
        return self.const(x, like.dtype)

    def zeros_like(self, r: Ref) -> Ref:
        return self.const(0, r.dtype, r.shape)

    def cast(self, r: Ref, dtype: dt.DType | str) -> Ref:
        d = dt.dtype(dtype)
        return r if r.dtype == d else self.op("cast", r, dtype=d.name)

    def unbroadcast(self, g: Ref, shape: tuple[int, ...]) -> Ref:
        """Sum ``g`` down to ``shape``: the adjoint of broadcasting ``shape`` to g.shape."""
        if g.shape == tuple(shape):
            return g
        lead = g.ndim - len(shape)
        axes = list(range(lead))
        axes += [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
        if axes:
            g = self.op("sum", g, axes=axes, keepdims=True)
        if g.shape != tuple(shape):
            g = self.op("reshape", g, shape=tuple(shape))
        return g

    def graph(self, outputs: Iterable[str | Ref]) -> Graph:
        outs = tuple(o.id if isinstance(o, Ref) else o for o in outputs)
        return Graph(dict(self.nodes), outs).sorted()
