"""Elementwise ops: unary, binary (numpy broadcasting), predicates, logic and ``where``.

Binary ops take operands of one dtype; the SDK casts before it builds them (an IR graph
with mixed dtypes is rejected with a DTypeError naming both).

Dtype policy (the ``dtypes`` of each op):

* numeric (ints and floats): neg, abs, sign, square, relu, floor, ceil, add, sub, mul,
  floor_divide, remainder, pow, maximum, minimum. floor and ceil are the identity on
  integers (as numpy 2's). Integer ``floor_divide`` and ``remainder`` by zero and integer
  ``pow`` with a negative exponent raise KernelError (kind user) at run time (numpy gives
  0 with a warning for the first two, and raises for the third).
* floats only: div (true division; the SDK casts integers to float64 first, as numpy's
  ``/`` does), exp, log, sqrt, rsqrt, reciprocal, sin, cos, tan, tanh, sigmoid, gelu,
  silu, erf.
* ``floor_divide`` and ``remainder`` are numpy's (Python's ``//`` and ``%``): the quotient
  rounded down, and ``x - floor(x / y) * y`` with the sign of the divisor.
* comparisons eq, ne, lt, le, gt, ge: any dtype (both the same), result bool.
* logical_and, logical_or, logical_not: bool only.
* where(cond, x, y): cond bool; x and y of one (any) dtype.

Gradient conventions (torch's): sign, floor, ceil and floor_divide have a zero gradient;
remainder's is 1 in x and ``-floor(x / y)`` in y; abs and relu
take the subgradient 0 at 0; maximum/minimum split the gradient 50/50 between the
operands where they tie; comparisons and logic carry none (their results are bool).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from triplane.proto import dtypes as dt
from triplane.proto.errors import DTypeError, NotDifferentiableError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import (
    Attr,
    GradCtx,
    GradRule,
    OpDef,
    OpGroup,
    SplitDecl,
    broadcast_shapes,
    elementwise_cost,
)

if TYPE_CHECKING:
    from triplane.proto.builder import Builder, Ref

OPS = OpGroup("elementwise")  # registered by triplane.proto.ops.register_all

BOOL = frozenset({"bool"})
# Elementwise ops split along any dimension; a broadcast (size-1) input dim is read whole.
SPLIT = SplitDecl("elementwise")


def _same(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    return ins[0]


def unary(name: str, grad: GradRule | None, *, dtypes: frozenset[str] = dt.FLOATS,
          flops: float = 1.0, doc: str = "") -> OpDef:
    return OPS.declare(OpDef(name, "elementwise", 1, _same, dtypes=dtypes, grad=grad,
                             cost=elementwise_cost(flops), elementwise=True, split=SPLIT, doc=doc))


def _broadcast(ins: Sequence[TensorType], out_dtype: dt.DType | None = None) -> TensorType:
    dts = {t.dtype for t in ins}
    if len(dts) > 1:
        raise DTypeError("operands have dtypes " + " and ".join(t.dtype.name for t in ins)
                         + "; cast them to one dtype first")
    return TensorType(broadcast_shapes(*(t.shape for t in ins)), out_dtype or ins[0].dtype)


def binary(name: str, grad: GradRule | None, *, dtypes: frozenset[str] = dt.NUMERIC,
           flops: float = 1.0, predicate: bool = False, doc: str = "") -> OpDef:
    def infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
        return _broadcast(ins, dt.bool_ if predicate else None)

    return OPS.declare(OpDef(name, "elementwise", 2, infer, dtypes=dtypes, grad=grad,
                             cost=elementwise_cost(flops), elementwise=True, split=SPLIT, doc=doc))


# --- gradient rules ---------------------------------------------------------------------

_SQRT2 = math.sqrt(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _mask(b: Builder, pred: Ref, like: Ref) -> Ref:
    """A bool predicate as 1.0 / 0.0 of ``like``'s dtype."""
    return b.cast(pred, like.dtype)


def _zero_grad(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    return [b.zeros_like(n.inputs[0])]


def _g_add(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [b.unbroadcast(g, x.shape), b.unbroadcast(g, y.shape)]


def _g_sub(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [b.unbroadcast(g, x.shape), b.unbroadcast(-g, y.shape)]


def _g_mul(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [b.unbroadcast(g * y, x.shape), b.unbroadcast(g * x, y.shape)]


def _g_div(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    gx = g / y
    return [b.unbroadcast(gx, x.shape), b.unbroadcast(-(gx * n.out), y.shape)]


def _g_floor_divide(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [b.zeros_like(x), b.zeros_like(y)]


def _g_remainder(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    # x % y = x - floor(x / y) * y, with floor's derivative taken as 0.
    x, y = n.inputs
    return [b.unbroadcast(g, x.shape), b.unbroadcast(-(g * b.op("floor_divide", x, y)), y.shape)]


def _g_pow(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    gx = g * y * b.op("pow", x, y - 1.0)
    # d/dy x**y = x**y ln x; taken as 0 where x == 0 (torch: the limit for y > 0, and
    # it keeps 0**y usable in a loss without a nan gradient).
    zero = b.const(0.0, x.dtype)
    dy = b.op("where", b.op("eq", x, zero), zero, n.out * b.op("log", x))
    return [b.unbroadcast(gx, x.shape), b.unbroadcast(g * dy, y.shape)]


def _g_extremum(pick: str) -> GradRule:
    """maximum (pick "gt") / minimum (pick "lt"): the gradient goes to the operand that
    was picked, half to each where they tie."""

    def rule(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
        x, y = n.inputs
        wx = _mask(b, b.op(pick, x, y), g) + _mask(b, b.op("eq", x, y), g) * 0.5
        gx = g * wx
        return [b.unbroadcast(gx, x.shape), b.unbroadcast(g - gx, y.shape)]

    return rule


def _g_where(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    c, x, y = n.inputs
    zero = b.const(0, g.dtype)
    return [None, b.unbroadcast(b.op("where", c, g, zero), x.shape),
            b.unbroadcast(b.op("where", c, zero, g), y.shape)]


def _g_abs(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    return [g * b.op("sign", n.inputs[0])]


def _g_relu(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x = n.inputs[0]
    return [g * _mask(b, b.op("gt", x, b.const(0, x.dtype)), g)]


def _g_sigmoid(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    s = n.out
    return [g * s * (1.0 - s)]


def _g_silu(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x = n.inputs[0]
    s = b.op("sigmoid", x)
    return [g * s * (1.0 + x * (1.0 - s))]


def _g_gelu(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    # d/dx x Phi(x) = Phi(x) + x phi(x), with Phi = (1 + erf(x / sqrt2)) / 2.
    x = n.inputs[0]
    cdf = (b.op("erf", x * (1.0 / _SQRT2)) + 1.0) * 0.5
    pdf = b.op("exp", x * x * -0.5) * _INV_SQRT_2PI
    return [g * (cdf + x * pdf)]


def _g_erf(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x = n.inputs[0]
    return [g * b.op("exp", -(x * x)) * _TWO_OVER_SQRT_PI]


# --- the ops ------------------------------------------------------------------------------

unary("neg", lambda b, n, g: [-g], dtypes=dt.NUMERIC, doc="-x")
unary("abs", _g_abs, dtypes=dt.NUMERIC, doc="|x| (integers wrap like numpy: abs(-128) in int8 is -128)")
unary("sign", _zero_grad, dtypes=dt.NUMERIC, doc="-1, 0 or 1 (nan stays nan); zero gradient")
unary("square", lambda b, n, g: [g * n.inputs[0] * 2.0], dtypes=dt.NUMERIC, doc="x * x")
unary("relu", _g_relu, dtypes=dt.NUMERIC, doc="max(x, 0); gradient 0 at 0")
unary("floor", _zero_grad, dtypes=dt.NUMERIC, doc="round down (identity on integers); zero gradient")
unary("ceil", _zero_grad, dtypes=dt.NUMERIC, doc="round up (identity on integers); zero gradient")
unary("exp", lambda b, n, g: [g * n.out], flops=8)
unary("log", lambda b, n, g: [g / n.inputs[0]], flops=8)
unary("sqrt", lambda b, n, g: [g * 0.5 / n.out], flops=4)
unary("rsqrt", lambda b, n, g: [g * n.out * n.out * n.out * -0.5], flops=5, doc="1 / sqrt(x)")
unary("reciprocal", lambda b, n, g: [-(g * n.out * n.out)], flops=1, doc="1 / x")
unary("sin", lambda b, n, g: [g * b.op("cos", n.inputs[0])], flops=8)
unary("cos", lambda b, n, g: [-(g * b.op("sin", n.inputs[0]))], flops=8)
unary("tan", lambda b, n, g: [g * (n.out * n.out + 1.0)], flops=10)
unary("tanh", lambda b, n, g: [g * (1.0 - n.out * n.out)], flops=10)
unary("sigmoid", _g_sigmoid, flops=10, doc="1 / (1 + exp(-x)), computed without overflow")
unary("silu", _g_silu, flops=11, doc="x * sigmoid(x)")
unary("gelu", _g_gelu, flops=30, doc="exact GELU: x * (1 + erf(x / sqrt 2)) / 2")
unary("erf", _g_erf, flops=25, doc="the error function (accurate to ~1e-15 relative in float64)")
unary("logical_not", None, dtypes=BOOL, doc="not x (bool only)")

binary("add", _g_add)
binary("sub", _g_sub)
binary("mul", _g_mul)
binary("div", _g_div, dtypes=dt.FLOATS, doc="x / y (true division; floats only: the SDK casts integers)")
binary("floor_divide", _g_floor_divide,
       doc="x // y rounded down (numpy.floor_divide); integers by 0: KernelError; zero gradient")
binary("remainder", _g_remainder,
       doc="x % y with the sign of y (numpy.remainder); integers by 0: KernelError")
binary("pow", _g_pow, flops=10,
       doc="x ** y; integers need y >= 0 (else KernelError); gradient in y taken 0 where x == 0")
binary("maximum", _g_extremum("gt"), doc="larger of two (nan propagates); ties split the gradient")
binary("minimum", _g_extremum("lt"), doc="smaller of two (nan propagates); ties split the gradient")
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    binary(_name, None, dtypes=dt.EVERY, predicate=True, doc=f"comparison {_name}; result bool")
binary("logical_and", None, dtypes=BOOL, doc="x and y (bool only)")
binary("logical_or", None, dtypes=BOOL, doc="x or y (bool only)")


def _infer_where(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    c, x, y = ins
    if c.dtype != dt.bool_:
        raise DTypeError(f"the condition has dtype {c.dtype.name}; it must be bool "
                         "(compare it with something first)")
    if x.dtype != y.dtype:
        raise DTypeError(f"the two branches have dtypes {x.dtype.name} and {y.dtype.name}; "
                         "cast them to one dtype first")
    return TensorType(broadcast_shapes(c.shape, x.shape, y.shape), x.dtype)


OPS.declare(OpDef("where", "elementwise", 3, _infer_where, grad=_g_where, nograd_inputs=frozenset({0}),
                  cost=elementwise_cost(1), elementwise=True, split=SPLIT,
                  doc="cond ? x : y elementwise, all three broadcast (numpy.where)"))


def _infer_cast(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    return TensorType(ins[0].shape, dt.dtype(a["dtype"]))


def _g_cast(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x = n.inputs[0]
    return [b.cast(g, x.dtype)]


def _cast_grad_allowed(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    if not n.inputs[0].dtype.is_float or not n.out.dtype.is_float:
        raise NotDifferentiableError(
            f"cast from {n.inputs[0].dtype} to {n.out.dtype} has no gradient (not between floats)")
    return _g_cast(b, n, g)


OPS.declare(OpDef("cast", "elementwise", 1, _infer_cast, attrs={"dtype": Attr("dtype")},
                  grad=_cast_grad_allowed, cost=elementwise_cost(0), elementwise=True, split=SPLIT,
                  doc="Convert to another dtype (numpy's astype: floats to ints truncate)."))
