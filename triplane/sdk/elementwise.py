"""Elementwise functions: ``tp.exp(x)``, ``tp.add(x, 1)``, ``tp.where(c, x, y)``, ...

Binary functions broadcast like numpy and promote dtypes (numpy's rules; a Python scalar
takes the tensor's dtype unless it is of a higher kind, e.g. a float beside integers,
which gives float32). Which dtypes each op accepts, and the gradient conventions (ties,
non-differentiable points), are listed in :mod:`triplane.proto.ops.elementwise`.
"""

from __future__ import annotations

from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto.errors import DTypeError
from triplane.sdk.tensor import Tensor, apply, as_tensor

__all__ = [
    "abs", "add", "cast", "ceil", "cos", "div", "eq", "erf", "exp", "floor", "ge", "gelu", "gt",
    "le", "log", "logical_and", "logical_not", "logical_or", "lt", "maximum", "minimum", "mul",
    "ne", "neg", "pow", "reciprocal", "relu", "rsqrt", "sigmoid", "sign", "silu", "sin", "sqrt",
    "square", "sub", "tan", "tanh", "where",
]

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
    return _float_unary("exp", x)


def log(x: Any) -> Tensor:
    return _float_unary("log", x)


def add(x: Any, y: Any) -> Tensor:
    return _binary("add", x, y)


def sub(x: Any, y: Any) -> Tensor:
    return _binary("sub", x, y)


def mul(x: Any, y: Any) -> Tensor:
    return _binary("mul", x, y)


def div(x: Any, y: Any) -> Tensor:
    """True division for floats; floor division for integers (like Python's //)."""
    return _binary("div", x, y)


def pow(x: Any, y: Any) -> Tensor:
    """x ** y. Integer tensors need non-negative exponents (a KernelError at run time
    otherwise); ``x ** 0.5`` of an integer tensor gives float32."""
    return _binary("pow", x, y)


def maximum(x: Any, y: Any) -> Tensor:
    """The larger of x and y (nan propagates); where they tie, each gets half the gradient."""
    return _binary("maximum", x, y)


def minimum(x: Any, y: Any) -> Tensor:
    """The smaller of x and y (nan propagates); where they tie, each gets half the gradient."""
    return _binary("minimum", x, y)


def eq(x: Any, y: Any) -> Tensor:
    return _binary("eq", x, y)


def ne(x: Any, y: Any) -> Tensor:
    return _binary("ne", x, y)


def lt(x: Any, y: Any) -> Tensor:
    return _binary("lt", x, y)


def le(x: Any, y: Any) -> Tensor:
    return _binary("le", x, y)


def gt(x: Any, y: Any) -> Tensor:
    return _binary("gt", x, y)


def ge(x: Any, y: Any) -> Tensor:
    return _binary("ge", x, y)


_LOGIC_SYMBOL = {"logical_and": "&", "logical_or": "|", "logical_not": "~"}


def _logical(op: str, *xs: Any) -> Tensor:
    # Checked before promotion, so that `mask & 1` names int64 and not a promoted dtype.
    for x in xs:
        d = dt.bool_ if isinstance(x, bool) else as_tensor(x).dtype
        if d != dt.bool_:
            raise DTypeError(f"{_LOGIC_SYMBOL[op]} needs bool tensors, got {d.name}; "
                             "compare first (e.g. x > 0) or cast with .astype(bool)", op=op)
    return apply(op, operands(*xs))


def logical_and(x: Any, y: Any) -> Tensor:
    """x and y, elementwise (``x & y``); bool tensors only."""
    return _logical("logical_and", x, y)


def logical_or(x: Any, y: Any) -> Tensor:
    """x or y, elementwise (``x | y``); bool tensors only."""
    return _logical("logical_or", x, y)


def logical_not(x: Any) -> Tensor:
    """not x, elementwise (``~x``); bool tensors only."""
    return _logical("logical_not", x)


def where(cond: Any, x: Any, y: Any) -> Tensor:
    """``x`` where ``cond`` holds, else ``y`` (numpy.where): all three broadcast, x and y
    promote like a binary op. The gradient flows to x and y through the mask only."""
    c = as_tensor(cond)
    if c.dtype != dt.bool_:
        raise DTypeError(f"where: the condition has dtype {c.dtype.name}; it must be bool", op="where")
    return apply("where", [c, *operands(x, y)])


def abs(x: Any) -> Tensor:
    """|x|; its gradient is sign(x) (0 at 0)."""
    return _unary("abs", x)


def sign(x: Any) -> Tensor:
    """-1, 0 or 1; zero gradient."""
    return _unary("sign", x)


def square(x: Any) -> Tensor:
    return _unary("square", x)


def relu(x: Any) -> Tensor:
    """max(x, 0); gradient 0 at 0."""
    return _unary("relu", x)


def floor(x: Any) -> Tensor:
    """Round down (the identity on integers); zero gradient."""
    return _unary("floor", x)


def ceil(x: Any) -> Tensor:
    """Round up (the identity on integers); zero gradient."""
    return _unary("ceil", x)


def _float_unary(op: str, x: Any) -> Tensor:
    """A float-only function: integer and bool tensors are cast to the default float
    first (as ``tp.sqrt(int_tensor)`` does in numpy)."""
    t = as_tensor(x)
    if not t.dtype.is_float:
        t = cast(t, dt.DEFAULT_FLOAT)
    return apply(op, [t])


def sqrt(x: Any) -> Tensor:
    return _float_unary("sqrt", x)


def rsqrt(x: Any) -> Tensor:
    """1 / sqrt(x)."""
    return _float_unary("rsqrt", x)


def reciprocal(x: Any) -> Tensor:
    """1 / x."""
    return _float_unary("reciprocal", x)


def sin(x: Any) -> Tensor:
    return _float_unary("sin", x)


def cos(x: Any) -> Tensor:
    return _float_unary("cos", x)


def tan(x: Any) -> Tensor:
    return _float_unary("tan", x)


def tanh(x: Any) -> Tensor:
    return _float_unary("tanh", x)


def sigmoid(x: Any) -> Tensor:
    return _float_unary("sigmoid", x)


def silu(x: Any) -> Tensor:
    """x * sigmoid(x)."""
    return _float_unary("silu", x)


def gelu(x: Any) -> Tensor:
    """The exact GELU, x * (1 + erf(x / sqrt 2)) / 2 (not the tanh approximation)."""
    return _float_unary("gelu", x)


def erf(x: Any) -> Tensor:
    return _float_unary("erf", x)
