"""The user op this package brings: ``vendor_softplus(x) = log(1 + exp(x))`` on float32.

Its definition (arity, dtypes, shape rule) goes in every process's op table through the
``triplane.ops`` entry point; its kernel is in the C library (engine ``vendor_c``)."""

from __future__ import annotations

from triplane.proto.opdef import OpDef

__all__ = ["OPS"]


def _same(inputs, attrs):  # the result has the input's shape and dtype
    return inputs[0]


OPS = [OpDef("vendor_softplus", "user", 1, _same, dtypes=frozenset({"float32"}),
             doc="log(1 + exp(x)), computed by the vendor_c engine's C library")]
