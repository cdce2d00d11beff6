"""Elementwise functions: ``tp.exp(x)``, ``tp.add(x, 1)``, ``tp.where(c, x, y)``, ...

Binary functions broadcast and promote dtypes as numpy 2 does (NEP 50, see
:mod:`triplane.proto.dtypes`): tensors promote with ``numpy.promote_types``; a Python
scalar is weak (``int8 + 1`` is int8, ``int8 + 0.5`` float64, ``float16 * 2.5`` float16).
Then, as numpy: ``/`` of integers gives float64; ``+``, ``*``, maximum and minimum of
bools are or, and, or, and (bool); ``x - y`` and ``-x`` of bools raise DTypeError; ``//``,
``%`` and ``**`` of two bools count in int8; float functions (exp, sqrt, sigmoid, ...) of
integers compute in :func:`~triplane.proto.dtypes.float_of` (float16 for int8, float64
for int64). Which dtypes each op of the IR accepts, and the gradient conventions (ties,
non-differentiable points), are listed in :mod:`triplane.proto.ops.elementwise`.
"""

from __future__ import annotations

from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto.errors import DTypeError
from triplane.sdk.tensor import Tensor, apply, as_tensor, is_weak, scalar

__all__ = [
    "abs", "add", "cast", "ceil", "cos", "div", "eq", "erf", "exp", "floor", "floor_divide", "ge",
    "gelu", "gt", "le", "log", "logical_and", "logical_not", "logical_or", "lt", "maximum",
    "minimum", "mul", "ne", "neg", "pow", "reciprocal", "relu", "remainder", "rsqrt", "sigmoid",
    "sign", "silu", "sin", "sqrt", "square", "sub", "tan", "tanh", "where",
]


def coerce(*xs: Any) -> list[Any]:
    """Python scalars as they are (weak), everything else as a Tensor: made once, so that
    an array operand becomes one input node however many times it is looked at."""
    return [x if is_weak(x) else as_tensor(x) for x in xs]


def result_dtype(*xs: Any) -> dt.DType:
    """The dtype tensors, arrays and Python scalars meet at (NEP 50)."""
    return dt.result_type(*(type(x) if is_weak(x) else as_tensor(x).dtype for x in xs))


def operands(*xs: Any, dtype: dt.DType | None = None) -> list[Tensor]:
    """Tensors of one dtype from tensors, scalars and arrays, casts inserted as needed:
    ``dtype``, or else the dtype they meet at (:func:`result_dtype`). A Python int the
    dtype cannot hold raises OverflowError, as in numpy."""
    strong = [None if is_weak(x) else as_tensor(x) for x in xs]
    target = dtype or dt.result_type(*(type(x) if t is None else t.dtype for x, t in zip(xs, strong)))
    return [scalar(x, target) if t is None else cast(t, target) for x, t in zip(xs, strong)]


def _unary(op: str, x: Any) -> Tensor:
    return apply(op, [as_tensor(x)])


def _bool_as(op: str, bool_op: str | None, x: Any, y: Any) -> Tensor:
    """``op`` of x and y, or ``bool_op`` when they meet at bool (numpy computes ``+`` of
    bools as or, ``*`` as and); ``bool_op`` None: bools are refused, as numpy's ``-``."""
    x, y = coerce(x, y)
    d = result_dtype(x, y)
    if d != dt.bool_:
        return apply(op, operands(x, y, dtype=d))
    if bool_op is None:
        raise DTypeError(f"{op} of two bools is not defined (numpy refuses it too); use x != y "
                         "for exclusive or, or cast to an integer dtype first", op=op)
    return apply(bool_op, operands(x, y, dtype=d))


def _int8_for_bools(op: str, x: Any, y: Any) -> Tensor:
    """``op`` of x and y, counted in int8 when both are bools (numpy's loop for //, %, **)."""
    x, y = coerce(x, y)
    d = result_dtype(x, y)
    return apply(op, operands(x, y, dtype=dt.int8 if d == dt.bool_ else d))


def cast(x: Any, dtype: Any) -> Tensor:
    """``x`` converted to ``dtype`` (no node when it already is)."""
    x = as_tensor(x)
    d = dt.dtype(dtype)
    return x if x.dtype == d else apply("cast", [x], dtype=d.name)


def neg(x: Any) -> Tensor:
    """-x; bools raise DTypeError (numpy's ``-`` of bools does too: use ``~x``)."""
    t = as_tensor(x)
    if t.dtype == dt.bool_:
        raise DTypeError("neg (-x) of a bool tensor is not defined; use ~x (logical_not)", op="neg")
    return apply("neg", [t])


def exp(x: Any) -> Tensor:
    return _float_unary("exp", x)


def log(x: Any) -> Tensor:
    return _float_unary("log", x)


def add(x: Any, y: Any) -> Tensor:
    """x + y (of two bools: x or y, as numpy)."""
    return _bool_as("add", "logical_or", x, y)


def sub(x: Any, y: Any) -> Tensor:
    """x - y; two bools raise DTypeError, as in numpy."""
    return _bool_as("sub", None, x, y)


def mul(x: Any, y: Any) -> Tensor:
    """x * y (of two bools: x and y, as numpy)."""
    return _bool_as("mul", "logical_and", x, y)


def div(x: Any, y: Any) -> Tensor:
    """x / y, true division: integers and bools give float64 (``tp.tensor(np.arange(6)) / 4``
    is ``[0., 0.25, ...]``), floats keep their dtype (``float32 / 2`` is float32)."""
    x, y = coerce(x, y)
    d = dt.true_divide_type(result_dtype(x, y))
    return apply("div", operands(x, y, dtype=d))


def floor_divide(x: Any, y: Any) -> Tensor:
    """x // y, the quotient rounded down (numpy.floor_divide; ``-7 // 2`` is -4). Integers
    keep their dtype; an integer divided by zero raises KernelError when the graph runs
    (numpy returns 0 with a warning). Zero gradient."""
    return _int8_for_bools("floor_divide", x, y)


def remainder(x: Any, y: Any) -> Tensor:
    """x % y with the sign of y (numpy.remainder, Python's %; ``-7 % 3`` is 2). An integer
    remainder by zero raises KernelError when the graph runs (numpy returns 0)."""
    return _int8_for_bools("remainder", x, y)


def pow(x: Any, y: Any) -> Tensor:
    """x ** y. Integer tensors need non-negative exponents (a KernelError at run time
    otherwise, as numpy raises); ``x ** 0.5`` of an integer tensor gives float64."""
    return _int8_for_bools("pow", x, y)


def maximum(x: Any, y: Any) -> Tensor:
    """The larger of x and y (nan propagates); where they tie, each gets half the gradient."""
    return _bool_as("maximum", "logical_or", x, y)


def minimum(x: Any, y: Any) -> Tensor:
    """The smaller of x and y (nan propagates); where they tie, each gets half the gradient."""
    return _bool_as("minimum", "logical_and", x, y)


def _compare(op: str, x: Any, y: Any) -> Tensor:
    """A comparison, exact for a Python int out of the tensor's range (``uint8 == -1`` is
    all False, as in numpy 2, rather than an OverflowError)."""
    x, y = coerce(x, y)
    d = result_dtype(x, y)
    if d.kind in ("int", "uint") and any(type(v) is int and not dt.fits(v, d) for v in (x, y)):
        big = next(v for v in (x, y) if type(v) is int and not dt.fits(v, d))
        d = dt.int64 if dt.fits(big, dt.int64) else dt.float64
    return apply(op, operands(x, y, dtype=d))


def eq(x: Any, y: Any) -> Tensor:
    return _compare("eq", x, y)


def ne(x: Any, y: Any) -> Tensor:
    return _compare("ne", x, y)


def lt(x: Any, y: Any) -> Tensor:
    return _compare("lt", x, y)


def le(x: Any, y: Any) -> Tensor:
    return _compare("le", x, y)


def gt(x: Any, y: Any) -> Tensor:
    return _compare("gt", x, y)


def ge(x: Any, y: Any) -> Tensor:
    return _compare("ge", x, y)


_LOGIC_SYMBOL = {"logical_and": "&", "logical_or": "|", "logical_not": "~"}


def _truth(x: Any) -> Tensor:
    """x as bool: numpy's truth of a number (non-zero; nan is true)."""
    return cast(as_tensor(x), dt.bool_)


def logical_and(x: Any, y: Any) -> Tensor:
    """x and y, elementwise, of any dtypes (non-zero is true, as numpy.logical_and); bool."""
    return apply("logical_and", [_truth(x), _truth(y)])


def logical_or(x: Any, y: Any) -> Tensor:
    """x or y, elementwise, of any dtypes (non-zero is true); bool."""
    return apply("logical_or", [_truth(x), _truth(y)])


def logical_not(x: Any) -> Tensor:
    """not x, elementwise, of any dtype (non-zero is true); bool."""
    return apply("logical_not", [_truth(x)])


def bool_operator(op: str, *xs: Any) -> Tensor:
    """The operators ``&``, ``|`` and ``~``: on bools only. numpy's are bitwise on integers,
    which triplane does not have, so an integer operand raises rather than being taken as
    a truth value."""
    for x in xs:
        d = dt.bool_ if type(x) is bool else as_tensor(x).dtype
        if d != dt.bool_:
            raise DTypeError(f"{_LOGIC_SYMBOL[op]} needs bool tensors, got {d.name}; "
                             "compare first (e.g. x > 0) or cast with .astype(bool)", op=op)
    return apply(op, operands(*xs))


def where(cond: Any, x: Any, y: Any) -> Tensor:
    """``x`` where ``cond`` holds, else ``y`` (numpy.where): all three broadcast, x and y
    promote like a binary op, a condition that is not bool counts non-zero as true. The
    gradient flows to x and y through the mask only."""
    return apply("where", [_truth(cond), *operands(x, y)])


def _same_for_bools(op: str, x: Any) -> Tensor:
    t = as_tensor(x)
    return t if t.dtype == dt.bool_ else apply(op, [t])


def abs(x: Any) -> Tensor:
    """|x| (bools stay as they are); its gradient is sign(x) (0 at 0)."""
    return _same_for_bools("abs", x)


def sign(x: Any) -> Tensor:
    """-1, 0 or 1; zero gradient."""
    return _unary("sign", x)


def square(x: Any) -> Tensor:
    """x * x (of bools: int8, as numpy)."""
    t = as_tensor(x)
    return apply("square", [cast(t, dt.int8) if t.dtype == dt.bool_ else t])


def relu(x: Any) -> Tensor:
    """max(x, 0); gradient 0 at 0."""
    return _unary("relu", x)


def floor(x: Any) -> Tensor:
    """Round down (the identity on integers and bools, as numpy 2's); zero gradient."""
    return _same_for_bools("floor", x)


def ceil(x: Any) -> Tensor:
    """Round up (the identity on integers and bools, as numpy 2's); zero gradient."""
    return _same_for_bools("ceil", x)


def as_float(x: Any) -> Tensor:
    """x, cast to the float dtype numpy's float functions compute it in when it is an
    integer or bool tensor (:func:`triplane.proto.dtypes.float_of`: int64 to float64)."""
    t = as_tensor(x)
    return cast(t, dt.float_of(t.dtype))


def _float_unary(op: str, x: Any) -> Tensor:
    """A float-only function: integer and bool tensors are cast as numpy's ufuncs cast
    them (``tp.sqrt(int64_tensor)`` is float64, ``tp.exp(uint8_tensor)`` float16)."""
    return apply(op, [as_float(x)])


def sqrt(x: Any) -> Tensor:
    return _float_unary("sqrt", x)


def rsqrt(x: Any) -> Tensor:
    """1 / sqrt(x)."""
    return _float_unary("rsqrt", x)


def reciprocal(x: Any) -> Tensor:
    """1 / x, a float function: integers are cast like exp's operand (numpy's
    ``np.reciprocal`` of integers is integer division, 0 for |x| > 1; triplane's is not)."""
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
