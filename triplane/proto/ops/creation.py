"""Creation ops: sources of a graph (no inputs). Their ``shape`` and ``dtype`` are attributes.

Random ops are pure functions of (seed, element index): the same seed gives the same
values on any engine and for any tiling (see docs/concepts.md, "Random numbers").
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence

from triplane.proto import dtypes as dt
from triplane.proto.errors import AttrError, LimitError, ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import Attr, Cost, CostFn, OpDef, OpGroup, SplitDecl

OPS = OpGroup("creation")  # registered by triplane.proto.ops.register_all

_SHAPE = Attr("shape")
_DTYPE = Attr("dtype", "float32")


def _declared(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    return TensorType(tuple(a["shape"]), dt.dtype(a["dtype"]))


def _free(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(0.0, 0.0)


def _write(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(0.0, float(out.nbytes))


def _check_number(v: object) -> str | None:
    if not isinstance(v, (bool, int, float)):
        return "must be a number or a boolean"
    if isinstance(v, float) and not math.isfinite(v):
        # JSON has no NaN or infinity: such fills travel as a 0-d 'constant' (inline
        # bytes) broadcast to the shape, as the SDK and Builder.const make them.
        return "must be finite (use a 0-d constant node for nan and infinities)"
    return None


OPS.declare(OpDef(
    "input", "creation", 0, _declared,
    attrs={"tensor": Attr("str"), "shape": _SHAPE, "dtype": _DTYPE},
    cost=_free, split=SplitDecl("input"), doc="Host data uploaded beforehand, referenced by tensor id."))


def _infer_constant(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    t = _declared(ins, a)
    try:
        raw = base64.b64decode(a["data"], validate=True)
    except ValueError:
        raise AttrError("attribute 'data' is not valid base64") from None
    if len(raw) != t.nbytes:
        raise AttrError(f"attribute 'data' holds {len(raw)} bytes; {t} needs {t.nbytes}")
    return t


OPS.declare(OpDef(
    "constant", "creation", 0, _infer_constant,
    attrs={"data": Attr("str"), "shape": _SHAPE, "dtype": _DTYPE},
    cost=_write, doc="Small inline data: little-endian bytes, base64 (what constant folding makes)."))

OPS.declare(OpDef(
    "full", "creation", 0, _declared,
    attrs={"value": Attr("any", check=_check_number), "shape": _SHAPE, "dtype": _DTYPE},
    cost=_write, split=SplitDecl("full"), doc="Every element set to one value (zeros, ones, scalars)."))


# --- ranges -------------------------------------------------------------------------------

# A range longer than this is surely a mistake (e.g. arange(0, 1e30)); the validator's
# element limit applies later too, but the shape must be computable first.
MAX_RANGE = 1 << 48


def arange_length(start: float, stop: float, step: float) -> int:
    """numpy.arange's element count: ceil((stop - start) / step), at least 0."""
    n = math.ceil((stop - start) / step)
    if n > MAX_RANGE:
        raise LimitError(f"arange({start}, {stop}, {step}) has {n} elements, more than {MAX_RANGE}")
    return max(0, n)


def _finite(v: float) -> str | None:
    return None if math.isfinite(v) else "must be finite"


def _nonzero(v: float) -> str | None:
    return _finite(v) or (None if v != 0 else "must not be zero")


def _infer_arange(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    n = arange_length(a["start"], a["stop"], a["step"])
    d = dt.dtype(a["dtype"])
    if d.kind == "bool":
        raise AttrError("arange cannot make bool tensors (dtype 'bool')")
    return TensorType((n,), d)


OPS.declare(OpDef(
    "arange", "creation", 0, _infer_arange,
    attrs={"start": Attr("float", 0.0, check=_finite), "stop": Attr("float", check=_finite),
           "step": Attr("float", 1.0, check=_nonzero), "dtype": Attr("dtype", "int64")},
    cost=_write,
    doc="numpy.arange: start + i * step for i < ceil((stop - start) / step), computed in "
        "float64 then converted (exact for integers up to 2**53)."))


def _non_negative(v: int) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _infer_eye(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    m = a["n"] if a["m"] is None else a["m"]
    return TensorType((a["n"], m), dt.dtype(a["dtype"]))


OPS.declare(OpDef(
    "eye", "creation", 0, _infer_eye,
    attrs={"n": Attr("int", check=_non_negative),
           "m": Attr("int", None, check=_non_negative, nullable=True),
           "k": Attr("int", 0), "dtype": _DTYPE},
    cost=_write, split=SplitDecl("eye"),
    doc="numpy.eye: n x m (m defaults to n), ones on diagonal k (k > 0: above)."))


# --- random -------------------------------------------------------------------------------


def _float_dtype(v: str) -> str | None:
    return None if v in dt.FLOATS else "random ops make floating-point tensors"


def _json_safe(v: int) -> str | None:
    # Seeds and offsets travel as JSON numbers; beyond 2**53 the JS and Go SDKs would
    # round them, and the same graph would hash differently.
    return None if 0 <= v < 1 << 53 else "must be in [0, 2**53)"


# A random tensor may be made a region at a time (a tile): the node then holds the box
# ``start .. start + shape`` of the tensor of shape ``full_shape`` that the same seed makes,
# bit for bit. Null (the default) means the node is the whole tensor.
REGION_ATTRS = {
    "full_shape": Attr("shape", None, nullable=True),
    "start": Attr("ints", None, nullable=True),
}


def check_region(shape: tuple[int, ...], a: Attrs) -> None:
    """Raise unless ``full_shape``/``start`` are both null, or describe a box of
    ``full_shape`` of size ``shape`` (the node's shape)."""
    full, start = a["full_shape"], a["start"]
    if full is None and start is None:
        return
    if full is None or start is None:
        raise AttrError("attributes 'full_shape' and 'start' go together (both null, or both set)")
    if not len(full) == len(start) == len(shape) or any(
            s < 0 or s + n > f for s, n, f in zip(start, shape, full)):
        raise ShapeError(f"a region of shape {tuple(shape)} at start {list(start)} does not fit "
                         f"full_shape {list(full)}")


_RANDOM_COMMON = {
    "shape": _SHAPE,
    "dtype": Attr("dtype", "float32", check=_float_dtype),
    "seed": Attr("int", check=_json_safe),
    "offset": Attr("int", 0, check=_json_safe),
    **REGION_ATTRS,
}


def _infer_random(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    check_region(tuple(a["shape"]), a)
    return _declared(ins, a)


def _infer_uniform(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    if not a["low"] <= a["high"]:
        raise AttrError(f"uniform needs low <= high, got low={a['low']} high={a['high']}")
    return _infer_random(ins, a)


def _random_cost(flops: float) -> CostFn:
    def cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
        return Cost(flops * out.size, float(out.nbytes))

    return cost


OPS.declare(OpDef(
    "uniform", "creation", 0, _infer_uniform,
    attrs={**_RANDOM_COMMON, "low": Attr("float", 0.0, check=_finite),
           "high": Attr("float", 1.0, check=_finite)},
    cost=_random_cost(20), random=True, split=SplitDecl("random"),
    doc="Uniform in [low, high): element i (row-major) is a function of (seed, offset + i) "
        "alone (engines/op/numpy_kernels/random.py); rounding to a narrow dtype may give high. "
        "With full_shape/start the node is that region of the full tensor."))

OPS.declare(OpDef(
    "normal", "creation", 0, _infer_random,
    attrs={**_RANDOM_COMMON, "mean": Attr("float", 0.0, check=_finite),
           "std": Attr("float", 1.0, check=lambda v: _finite(v) or (None if v >= 0 else "must be >= 0"))},
    cost=_random_cost(60), random=True, split=SplitDecl("random"),
    doc="Normal(mean, std): element i is a function of (seed, offset + i) alone (Box-Muller "
        "on two counter-based streams; see engines/op/numpy_kernels/random.py). With "
        "full_shape/start the node is that region of the full tensor."))
