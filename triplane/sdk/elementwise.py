"""Elementwise functions: ``tp.exp(x)``, ``tp.add(x, 1)``, ``tp.where(c, x, y)``, ...

Binary functions broadcast like numpy and promote dtypes (numpy's rules; a Python scalar
takes the tensor's dtype unless it is of a higher kind, e.g. a float beside integers,
which gives float32).
"""

from __future__ import annotations

from typing import Any

from triplane.proto import dtypes as dt
from triplane.sdk.tensor import Tensor, apply, as_tensor

__all__ = ["add", "cast", "div", "exp", "log", "mul", "neg", "sub"]

_KIND_RANK = {"bool": 0, "uint": 1, "int": 1, "float": 2}


def operands(*xs: Any) -> list[Tensor]:
    """Tensors of one dtype from tensors, scalars and arrays (casts inserted as needed)."""
    like = next((x for x in xs if isinstance(x, Tensor)), None)
    ts = [as_tensor(x, like) for x in xs]
    strong = [t for x, t in zip(xs, ts) if isinstance(x, Tensor) or not isinstance(x, (bool, int, float))]
    weak = [t for x, t in zip(xs, ts) if not (isinstance(x, Tensor) or not isinstance(x, (bool, int, float)))]
    target = strong[0].dtype if strong else ts[0].dtype
    for t in strong[1:]:
        target = dt.promote(target, t.dtype)
    for t in weak:
        if _KIND_RANK[t.dtype.kind] > _KIND_RANK[target.kind]:
            target = t.dtype
    return [cast(t, target) for t in ts]


def _unary(op: str, x: Any) -> Tensor:
    return apply(op, [as_tensor(x)])


def _binary(op: str, x: Any, y: Any) -> Tensor:
    return apply(op, operands(x, y))


def cast(x: Any, dtype: Any) -> Tensor:
    """``x`` converted to ``dtype`` (no node when it already is)."""
    x = as_tensor(x)
    d = dt.dtype(dtype)
    return x if x.dtype == d else apply("cast", [x], dtype=d.name)


def neg(x: Any) -> Tensor:
    return _unary("neg", x)


def exp(x: Any) -> Tensor:
    return _unary("exp", x)


def log(x: Any) -> Tensor:
    return _unary("log", x)


def add(x: Any, y: Any) -> Tensor:
    return _binary("add", x, y)


def sub(x: Any, y: Any) -> Tensor:
    return _binary("sub", x, y)


def mul(x: Any, y: Any) -> Tensor:
    return _binary("mul", x, y)


def div(x: Any, y: Any) -> Tensor:
    """True division for floats; floor division for integers (like Python's //)."""
    return _binary("div", x, y)
