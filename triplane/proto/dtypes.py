"""Tensor element types of the graph contract.

A dtype is named by a string on the wire (``"float32"``); in Python it is a
:class:`DType` with its numpy equivalent. ``bfloat16`` maps to ``ml_dtypes.bfloat16``;
engines that cannot compute in it compute in float32 and round the result back.

Binary ops of the IR take operands of one dtype: promotion is the SDK's job (it inserts
``cast`` nodes following the rules below), so that the IR says exactly what runs.

The rules are numpy 2's (NEP 50), so a program gives numpy's result dtypes:

* :func:`promote`: two tensors meet at ``numpy.promote_types`` (int8 with uint8 is
  int16; an integer with a float is at least that float: int32 with float32 is float64);
  bfloat16 goes as float16 would.
* :func:`result_type`: a Python ``int`` or ``float`` beside tensors is *weak*: it takes
  the tensors' dtype when that is of its kind or higher (``int8 + 1`` is int8,
  ``float16 * 2.5`` is float16) and the default of its kind otherwise (``int8 + 0.5`` is
  float64, ``bool + 1`` is int64). A Python ``bool`` is a bool tensor's dtype. numpy
  scalars (``np.float32(2)``) are not weak: they are 0-d tensors.
* :func:`float_of`: a float function (exp, sqrt, sin, ...) of an integer or bool tensor
  computes in the float numpy's ufuncs pick: the smallest that holds the integer type
  (bool, int8, uint8: float16; int16: float32; int32, int64: float64).
* :func:`true_divide_type`: ``/`` of integers or bools gives float64.
* :func:`sum_type`: sums and products of bools and integers narrower than int64 count in
  int64 (numpy would give uint64 for uint8, which triplane does not have).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import ml_dtypes
import numpy as np

from triplane.proto.errors import DTypeError

Kind = Literal["float", "int", "uint", "bool"]


@dataclass(frozen=True)
class DType:
    name: str
    kind: Kind
    itemsize: int

    @property
    def np(self) -> np.dtype:
        return _NUMPY[self.name]

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"tp.{self.name}"


float16 = DType("float16", "float", 2)
bfloat16 = DType("bfloat16", "float", 2)
float32 = DType("float32", "float", 4)
float64 = DType("float64", "float", 8)
int8 = DType("int8", "int", 1)
int16 = DType("int16", "int", 2)
int32 = DType("int32", "int", 4)
int64 = DType("int64", "int", 8)
uint8 = DType("uint8", "uint", 1)
bool_ = DType("bool", "bool", 1)

ALL: tuple[DType, ...] = (float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8, bool_)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}
FLOATS = frozenset(d.name for d in ALL if d.kind == "float")
INTS = frozenset(d.name for d in ALL if d.kind in ("int", "uint"))
NUMERIC = FLOATS | INTS
EVERY = frozenset(BY_NAME)

_NUMPY: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}

DEFAULT_FLOAT = float32
DEFAULT_INT = int64


def name_of(npd: np.dtype) -> str:
    """The wire name of numpy dtype ``npd`` (a dict lookup: ``np.dtype.name`` is not)."""
    name = _FROM_NUMPY.get(npd)
    return name if name is not None else npd.name


def dtype(x: DType | str | np.dtype | type) -> DType:
    """Resolve a dtype given as a :class:`DType`, a wire name, or a numpy dtype/type."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in BY_NAME:
        return BY_NAME[x]
    if x is float:
        return DEFAULT_FLOAT
    if x is int:
        return DEFAULT_INT
    if x is bool:
        return bool_
    try:
        npd = np.dtype(x)
    except TypeError:
        npd = None
    if npd is not None and npd in _FROM_NUMPY:
        return BY_NAME[_FROM_NUMPY[npd]]
    raise DTypeError(f"unsupported dtype {x!r} (known dtypes: {sorted(BY_NAME)})")


def promote(a: DType, b: DType) -> DType:
    """The dtype two operands meet at: numpy's rules, with bfloat16 (which numpy lacks)
    treated like float16: with bool, int8, uint8 it stays bfloat16, with int16 it is
    float32, with int32 and int64 float64; bfloat16 with float16 is float32 (neither holds
    the other)."""
    if a == b:
        return a
    if a.name == "bfloat16" or b.name == "bfloat16":
        other = b if a.name == "bfloat16" else a
        if other.kind == "float":
            return other if other.itemsize > 2 else float32
        like_half = promote(float16, other)
        return bfloat16 if like_half == float16 else like_half
    return dtype(np.promote_types(a.np, b.np))


def result_type(*operands: DType | type) -> DType:
    """The dtype operands meet at under NEP 50. An operand is a :class:`DType` (a tensor's:
    strong) or one of the Python types ``bool``, ``int``, ``float`` (a Python scalar of
    that type: weak, see the module docstring). Only Python scalars: the default dtype of
    the highest kind (float64, int64 or bool), as numpy gives for ``np.add(1, 2.5)``."""
    strong = [o if isinstance(o, DType) else bool_ for o in operands if isinstance(o, DType) or o is bool]
    weak = [o for o in operands if o is int or o is float]
    if len(strong) + len(weak) != len(operands):
        bad = next(o for o in operands if not (isinstance(o, DType) or o in (bool, int, float)))
        raise DTypeError(f"cannot promote {bad!r}: operands are dtypes or the types bool, int, float")
    if not operands:
        raise DTypeError("result_type of no operands")
    out = strong[0] if strong else (float64 if float in weak else int64 if int in weak else bool_)
    for s in strong[1:]:
        out = promote(out, s)
    if float in weak and out.kind != "float":
        out = float64
    elif int in weak and out.kind == "bool":
        out = int64
    return out


def float_of(d: DType) -> DType:
    """The float dtype a float function (exp, sqrt, ...) computes ``d`` in: ``d`` itself
    when it is a float, else numpy's pick (bool, int8, uint8: float16; int16: float32;
    int32, int64: float64)."""
    return d if d.kind == "float" else dtype(np.promote_types(d.np, np.float16))


def true_divide_type(d: DType) -> DType:
    """The dtype of ``x / y`` when the operands meet at ``d``: floats stay, integers and
    bools give float64 (numpy's true division)."""
    return d if d.kind == "float" else float64


def sum_type(d: DType) -> DType:
    """The dtype a sum or product of ``d`` counts in: int64 for bools and integers (numpy's
    default integer; it would give uint64 for uint8), ``d`` for floats."""
    return d if d.kind == "float" else int64


def fits(value: int, d: DType) -> bool:
    """Whether the Python int ``value`` is representable in the integer dtype ``d`` (floats
    and bool hold every int numpy lets through: they are always True)."""
    if d.kind not in ("int", "uint"):
        return True
    info = np.iinfo(d.np)
    return int(info.min) <= value <= int(info.max)


def scalar_dtype(value: object) -> DType:
    """The dtype a Python scalar makes on its own (a fill value, ``tp.tensor(2.5)``): bool,
    int64, or float32 (triplane's default float, as in PyTorch). Beside tensors a scalar
    is weak instead: see :func:`result_type`."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return DEFAULT_INT
    if isinstance(value, float):
        return DEFAULT_FLOAT
    raise DTypeError(f"cannot use {type(value).__name__} {value!r} as a tensor scalar")
