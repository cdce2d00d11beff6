"""The values a graph node carries besides its op: its static type (:class:`TensorType`)
and its attributes (:class:`Attrs`, immutable and hashable), and the rules for what an
attribute value may hold so that it survives canonical JSON (``canonjson.py``) in every
language: valid Unicode, finite floats without negative zero, integers within +-2**53.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from triplane.proto import dtypes as dt
from triplane.proto.errors import GraphError

__all__ = [
    "EMPTY_ATTRS", "MAX_SAFE_INT", "Attrs", "TensorType", "check_text", "check_wire_value", "encode_data",
    "fits_json", "freeze", "thaw",
]

MAX_SAFE_INT = 2**53  # JSON numbers are doubles; integers are exact up to here


class TensorType(NamedTuple):
    """The static type of a value: shape and dtype."""

    shape: tuple[int, ...]
    dtype: dt.DType

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.name}{list(self.shape)}"


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute mapping. Values are frozen: lists become tuples,
    dicts become Attrs, numpy scalars become Python scalars."""

    __slots__ = ("_d", "_h")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        src = items.items() if isinstance(items, Mapping) else items
        d: dict[str, Any] = {}
        for k, v in src:
            if not isinstance(k, str):
                raise GraphError(f"attribute names are strings, got {type(k).__name__} {k!r}")
            d[check_text(k)] = freeze(v)
        self._d = d
        self._h: int | None = None

    @classmethod
    def frozen(cls, d: dict[str, Any]) -> Attrs:
        """Wrap ``d`` whose keys are str and values already frozen (the op table's
        normalised values are), skipping the per-value copy."""
        a = cls.__new__(cls)
        a._d = d
        a._h = None
        return a

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    # The Mapping mixins would go through __getitem__ per key; the dict's views are direct.
    def items(self) -> Any:
        return self._d.items()

    def keys(self) -> Any:
        return self._d.keys()

    def values(self) -> Any:
        return self._d.values()

    def get(self, key: str, default: Any = None) -> Any:
        return self._d.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(tuple(sorted(self._d.items(), key=lambda kv: kv[0])))
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._d == other._d
        if isinstance(other, Mapping):
            return self._d == {k: freeze(v) for k, v in other.items()}
        return NotImplemented

    def __repr__(self) -> str:
        return f"Attrs({self._d!r})"

    def replace(self, **changes: Any) -> Attrs:
        return Attrs({**self._d, **changes})


EMPTY_ATTRS = Attrs()


def freeze(v: Any) -> Any:
    """A hashable, canonical copy of an attribute value."""
    # Exact builtin types first: a graph of 10^4 nodes freezes ~10^5 values on submit, and
    # the isinstance chain below (for subclasses, numpy scalars, mappings) costs 4x more.
    t = type(v)
    if t is float:
        return v + 0.0  # no negative zero: see below
    if t is int or t is bool or v is None:
        return v
    if t is str:
        return v if v.isascii() else check_text(v)
    if t is list or t is tuple:
        return tuple([freeze(x) for x in v])
    if v is None or isinstance(v, (bool, Attrs)):
        return v
    if isinstance(v, str):
        return check_text(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        # The wire has no negative zero (canonical JSON writes -0.0 as 0), so neither does
        # a graph: otherwise a graph and its round trip would differ.
        return float(v) + 0.0
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, Mapping):
        return Attrs(v)
    if isinstance(v, dt.DType):
        return v.name
    item = getattr(v, "item", None)  # numpy scalar
    if callable(item) and getattr(v, "shape", None) == ():
        return freeze(item())
    raise GraphError(f"attribute value {v!r} of type {type(v).__name__} cannot go in a graph")


def check_text(s: str) -> str:
    """``s`` if it is valid Unicode (no lone surrogates, which UTF-8 cannot carry)."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise GraphError(f"string {s!r} is not valid Unicode (lone surrogate)") from None
    return s


def check_wire_value(v: Any, where: str) -> None:
    """Reject what canonical JSON cannot carry anywhere in a (frozen) attribute value: NaN,
    infinities and integers beyond 2**53, so a graph that parses can be hashed and sent."""
    t = type(v)
    if t is float:
        if math.isfinite(v):
            return
    elif t is str or t is bool or v is None:
        return
    if isinstance(v, int) and not isinstance(v, bool):
        if abs(v) > MAX_SAFE_INT:
            raise GraphError(f"attribute {where} holds the integer {v}, beyond +-2**53")
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise GraphError(f"attribute {where} holds {v!r}; NaN and infinities cannot go in "
                             "a graph document (use a 'constant' node)")
    elif isinstance(v, tuple):
        for x in v:
            check_wire_value(x, where)
    elif isinstance(v, Attrs):
        for k, x in v.items():
            check_wire_value(x, f"{where}.{k}")


def fits_json(x: float) -> bool:
    """Whether float ``x`` survives canonical JSON unchanged: not NaN, not infinite, not
    -0.0 (written as 0). Scalars that do not fit travel as ``constant`` nodes instead."""
    return math.isfinite(x) and not (x == 0 and math.copysign(1.0, x) < 0)


def encode_data(value: Any) -> str:
    """The ``data`` attribute of a ``constant`` node holding array ``value``: its
    little-endian bytes in row-major order, base64."""
    import numpy as np

    arr = np.asarray(value)
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return base64.b64encode(arr.tobytes()).decode("ascii")


_SCALARS = (str, int, float, bool, type(None))


def thaw(v: Any) -> Any:
    """The JSON-ready form of a frozen attribute value."""
    t = type(v)
    if t in _SCALARS:
        return v
    if t is tuple:
        return [x if type(x) in _SCALARS else thaw(x) for x in v]
    if t is Attrs:
        return {k: x if type(x) in _SCALARS else thaw(x) for k, x in v._d.items()}
    return v
