"""Tensor element types of the graph contract.

A dtype is named by a string on the wire (``"float32"``); in Python it is a
:class:`DType` with its numpy equivalent. ``bfloat16`` maps to ``ml_dtypes.bfloat16``;
engines that cannot compute in it compute in float32 and round the result back.

Binary ops of the IR take operands of one dtype: promotion is the SDK's job (it inserts
``cast`` nodes following :func:`promote`), so that the IR says exactly what runs.
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


_RANK = {"bool": 0, "uint": 1, "int": 2, "float": 3}


def promote(a: DType, b: DType) -> DType:
    """The dtype two operands meet at: numpy's rules, with bfloat16 treated like float16
    (bfloat16 with float16 goes to float32)."""
    if a == b:
        return a
    if {a.name, b.name} == {"bfloat16", "float16"}:
        return float32
    if a.name == "bfloat16" or b.name == "bfloat16":
        other = b if a.name == "bfloat16" else a
        return bfloat16 if other.kind != "float" else other
    return dtype(np.promote_types(a.np, b.np))


def scalar_dtype(value: object, like: DType | None) -> DType:
    """The dtype a Python scalar takes beside a tensor of dtype ``like`` (a "weak" scalar:
    ``x * 2`` keeps x's dtype; a float scalar with an integer tensor gives the default float)."""
    if isinstance(value, bool):
        return like if like is not None else bool_
    if isinstance(value, int):
        return like if like is not None and like.kind != "bool" else DEFAULT_INT
    if isinstance(value, float):
        return like if like is not None and like.kind == "float" else DEFAULT_FLOAT
    raise DTypeError(f"cannot use {type(value).__name__} {value!r} as a tensor scalar")
