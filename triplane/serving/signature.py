"""A model's signature as the server sees it: checking predict inputs against it, the
pydantic models of the HTTP API generated from it, and the tensor forms of the wire.

An input arrives as nested lists (JSON numbers; the element type and, for fixed
dimensions, the lengths are in the OpenAPI schema) or as ``{"shape", "dtype", "data"}``
with ``data`` the base64 of raw little-endian C-order bytes (the form of the scheduler's
inline tensors and of the gRPC ``Tensor``). Every refusal is a domain error naming the
input: ``request`` (missing or unknown input, ragged lists, a bad base64), ``shape`` or
``dtype`` (400 over HTTP, INVALID_ARGUMENT over gRPC), or ``too_large`` (more rows than
one request may carry, 413).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, create_model

from triplane.proto import dtypes as dt
from triplane.proto.errors import DTypeError, ShapeError
from triplane.scheduler.errors import BadRequest, TooLarge

__all__ = ["Spec", "batchable", "check_inputs", "decode_tensor", "encode_tensor", "request_model",
           "response_model", "specs_of"]


@dataclass(frozen=True)
class Spec:
    """One input or output: name, dtype name, shape (None: any size)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def describe(self) -> str:
        return f"{self.dtype}[{', '.join('*' if d is None else str(d) for d in self.shape)}]"


def specs_of(tensor_specs: Sequence[Any]) -> list[Spec]:
    """The server's specs of a model signature's ``TensorSpec`` list."""
    return [Spec(str(s.name), dt.dtype(s.dtype).name, tuple(None if d is None else int(d) for d in s.shape))
            for s in tensor_specs]


def batchable(inputs: Sequence[Spec], outputs: Sequence[Spec]) -> bool:
    """Whether requests can be stacked along axis 0: every input and output has a
    dynamic leading dimension (the batch)."""
    return all(s.shape and s.shape[0] is None for s in (*inputs, *outputs))


# --- the wire forms ---------------------------------------------------------------------


def encode_tensor(arr: np.ndarray) -> dict[str, Any]:
    """``{"shape", "dtype", "data"}`` of ``arr`` (base64 of little-endian C-order bytes)."""
    d = dt.dtype(arr.dtype)
    raw = np.ascontiguousarray(arr, dtype=d.np.newbyteorder("<")).tobytes()
    return {"shape": list(arr.shape), "dtype": d.name, "data": base64.b64encode(raw).decode()}


def decode_tensor(name: str, dtype: str, shape: Sequence[int], data: bytes | str) -> np.ndarray:
    """The array a tensor form holds; errors name the input ``name``."""
    try:
        d = dt.dtype(dtype)
    except (DTypeError, TypeError, ValueError):
        raise DTypeError(f"input {name!r}: unknown dtype {str(dtype)[:40]!r}") from None
    if len(shape) > 32 or any(int(s) < 0 for s in shape):
        raise ShapeError(f"input {name!r}: bad shape {list(shape)[:40]}")
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"input {name!r}: 'data' is not base64") from None
    need = int(np.prod(shape, dtype=np.int64)) * d.itemsize
    if len(data) != need:
        raise BadRequest(f"input {name!r}: {d.name}{list(shape)} is {need} bytes, 'data' has {len(data)}")
    return np.frombuffer(data, dtype=d.np.newbyteorder("<")).astype(d.np).reshape(tuple(shape))


def _from_json(spec: Spec, value: Any) -> np.ndarray:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, dict):
        return decode_tensor(spec.name, value["dtype"], value["shape"], value["data"])
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged lists (numpy >= 1.24)
        raise BadRequest(f"input {spec.name!r}: not a {spec.describe()} array of nested lists "
                         f"({e})") from None
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise BadRequest(f"input {spec.name!r}: not a {spec.describe()} array of nested lists of numbers")
    want = dt.dtype(spec.dtype).np
    if arr.size and not np.can_cast(arr.dtype, want, "same_kind"):  # 1.5 for an int, 2 for a bool
        raise DTypeError(f"input {spec.name!r}: {arr.dtype.name} values for an input of {spec.describe()}")
    return arr.astype(want, copy=False)


def check_inputs(specs: Sequence[Spec], given: Mapping[str, Any], max_rows: int | None) -> list[np.ndarray]:
    """The inputs in signature order as arrays, each checked against its spec; a domain
    error naming the first input that is missing, unknown or of the wrong dtype, shape or
    batch size. ``given`` values are arrays, nested lists or tensor forms. With
    ``max_rows``, every input's leading dimension must agree and be at most that."""
    names = [s.name for s in specs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise BadRequest(f"unknown input(s) {unknown} (the model's inputs: {names})")
    out = []
    for spec in specs:
        if spec.name not in given:
            raise BadRequest(f"missing input {spec.name!r} ({spec.describe()}; the model's inputs: {names})")
        v = given[spec.name]
        arr = v if isinstance(v, np.ndarray) else _from_json(spec, v)
        if dt.dtype(arr.dtype).name != spec.dtype:
            raise DTypeError(f"input {spec.name!r} has dtype {dt.dtype(arr.dtype).name}, "
                             f"the model takes {spec.describe()}")
        if arr.ndim != len(spec.shape) or any(w not in (None, h) for w, h in zip(spec.shape, arr.shape)):
            raise ShapeError(f"input {spec.name!r} has shape {list(arr.shape)}, "
                             f"the model takes {spec.describe()}")
        out.append(arr)
    if max_rows is not None and out:
        rows = {a.shape[0] for a in out}
        if len(rows) > 1:
            raise ShapeError(f"the inputs' leading (batch) dimensions differ: "
                             f"{ {s.name: a.shape[0] for s, a in zip(specs, out)} }")
        n = rows.pop()
        if n == 0:
            raise ShapeError(f"input {specs[0].name!r} has no rows (batch size 0)")
        if n > max_rows:
            raise TooLarge(f"input {specs[0].name!r} has {n} rows; one request may carry at most {max_rows} "
                           "(the server's max batch size)")
    return out


# --- the HTTP API's models ----------------------------------------------------------------

_ELEMENT: dict[str, Any] = {"bool": StrictBool}


def _element(dtype: str) -> Any:
    d = dt.dtype(dtype)
    return _ELEMENT.get(d.name) or (StrictFloat if d.is_float else StrictInt)


def _nested(spec: Spec) -> Any:
    t: Any = _element(spec.dtype)
    for d in reversed(spec.shape):
        t = list[t] if d is None else Annotated[list[t], Field(min_length=d, max_length=d)]
    return t


class TensorB64(BaseModel):
    """A tensor as raw bytes: little-endian C order, base64."""

    model_config = ConfigDict(extra="forbid")
    shape: list[Annotated[int, Field(ge=0)]] = Field(max_length=32)
    dtype: str
    data: str


def _model_name(prefix: str, name: str) -> str:
    return prefix + "".join(ch for ch in name.title() if ch.isalnum())


def request_model(specs: Sequence[Spec]) -> type[BaseModel]:
    """``PredictRequest``: ``{"inputs": {name: nested lists | TensorB64}}`` typed per input."""
    fields: dict[str, Any] = {
        s.name: (_nested(s) | TensorB64, Field(description=f"{s.describe()} (nested lists, or raw bytes)"))
        for s in specs}
    inputs = create_model("PredictInputs", __config__=ConfigDict(extra="forbid"), **fields)
    return create_model("PredictRequest", __config__=ConfigDict(extra="forbid"), inputs=(inputs, ...))


def response_model(specs: Sequence[Spec]) -> type[BaseModel]:
    """``PredictResponse``: ``{"outputs": {name: nested lists}, "model_version"}``."""
    fields: dict[str, Any] = {s.name: (_nested(s), Field(description=s.describe())) for s in specs}
    outputs = create_model("PredictOutputs", **fields)
    return create_model("PredictResponse", outputs=(outputs, ...), model_version=(str, ...))
