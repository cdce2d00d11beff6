"""Creation ops: sources of a graph (no inputs). Their ``shape`` and ``dtype`` are attributes.

Random ops are pure functions of (seed, element index): the same seed gives the same
values on any engine and for any tiling (see docs/concepts.md, "Random numbers").
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from triplane.proto import dtypes as dt
from triplane.proto.errors import AttrError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.optable import Attr, Cost, OpDef, register

_SHAPE = Attr("shape")
_DTYPE = Attr("dtype", "float32")


def _declared(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    return TensorType(tuple(a["shape"]), dt.dtype(a["dtype"]))


def _free(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(0.0, 0.0)


def _write(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(0.0, float(out.nbytes))


def _check_number(v: object) -> str | None:
    if isinstance(v, bool) or isinstance(v, (int, float)):
        return None
    return "must be a number or a boolean"


register(OpDef(
    "input", "creation", 0, _declared,
    attrs={"tensor": Attr("str"), "shape": _SHAPE, "dtype": _DTYPE},
    cost=_free, doc="Host data uploaded beforehand, referenced by tensor id."))


def _infer_constant(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    t = _declared(ins, a)
    try:
        raw = base64.b64decode(a["data"], validate=True)
    except ValueError:
        raise AttrError("attribute 'data' is not valid base64") from None
    if len(raw) != t.nbytes:
        raise AttrError(f"attribute 'data' holds {len(raw)} bytes; {t} needs {t.nbytes}")
    return t


register(OpDef(
    "constant", "creation", 0, _infer_constant,
    attrs={"data": Attr("str"), "shape": _SHAPE, "dtype": _DTYPE},
    cost=_write, doc="Small inline data: little-endian bytes, base64 (what constant folding makes)."))

register(OpDef(
    "full", "creation", 0, _declared,
    attrs={"value": Attr("any", check=_check_number), "shape": _SHAPE, "dtype": _DTYPE},
    cost=_write, doc="Every element set to one value (zeros, ones, scalars)."))
