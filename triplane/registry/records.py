"""The registry's typed records, their keys and their JSON encoding.

Key layout (relative to the backend prefix, ``/triplane/`` by default):

    nodes/<node>                        NodeInfo
    engines/op/<node>/<engine>          OpEngineInfo
    engines/memory/<node>/<engine>      MemoryEngineInfo
    engines/network/<node>/<engine>     NetworkEngineInfo
    bindings/<node>/<op-engine>         Binding
    drained/<node>                      Drained (no lease: outlives the node's registration)
    scheduler/leader                    the elected scheduler (see leader.py)

Values are canonical JSON objects (sorted keys, no whitespace). Decoding is strict: a
missing, extra-typed or malformed field raises :class:`RecordError` (a ``ValueError``)
naming the key, so a reader can skip the entry with a warning instead of crashing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any, ClassVar, TypeVar

from triplane.registry.backend import RegistryError

__all__ = [
    "Binding",
    "Drained",
    "MemoryEngineInfo",
    "NetworkEngineInfo",
    "NodeInfo",
    "OpEngineInfo",
    "Record",
    "RecordError",
    "check_name",
    "decode",
    "encode",
]


class RecordError(RegistryError, ValueError):
    """A registry value that does not decode to the record its key promises."""


def check_name(name: object, what: str = "name") -> str:
    """A node or engine name: a non-empty str usable as one key segment."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty str, got {name!r}")
    if "/" in name or "\x00" in name or name in (".", ".."):
        raise ValueError(f"{what} {name!r} may not contain '/' or NUL, nor be '.' or '..'")
    return name


@dataclasses.dataclass(frozen=True)
class Record:
    """Base of registry records: ``key()`` says where it lives."""

    kind_prefix: ClassVar[str] = ""

    def key(self) -> str:
        raise NotImplementedError("a Record subclass must say where it is stored")

    def _key(self, *segments: str) -> str:
        """``kind_prefix`` followed by the segments: the prefix is written in one place."""
        return self.kind_prefix + "/".join(segments)


@dataclasses.dataclass(frozen=True)
class NodeInfo(Record):
    """An executor node: where to send packets and pull tiles, and who it is."""

    node: str
    address: str
    udp_port: int
    tcp_port: int
    data_port: int
    version: str
    started_at: float
    pid: int
    cpus: int = 0  # CPU cores the executor may use (0: not reported); executors of one host share them

    kind_prefix: ClassVar[str] = "nodes/"

    def key(self) -> str:
        return self._key(check_name(self.node, "node"))


@dataclasses.dataclass(frozen=True)
class OpEngineInfo(Record):
    """An op engine of a node with its measured figures (matmul GFLOP/s, elementwise GB/s)."""

    node: str
    engine: str
    kind: str
    device: str
    ops: tuple[str, ...]
    dtypes: tuple[str, ...]
    gflops: float
    gbps: float

    kind_prefix: ClassVar[str] = "engines/op/"

    def key(self) -> str:
        return self._key(check_name(self.node, "node"), check_name(self.engine, "engine"))


@dataclasses.dataclass(frozen=True)
class MemoryEngineInfo(Record):
    """A memory engine of a node: kind (host, device, redis, file), capacity and free bytes."""

    node: str
    engine: str
    kind: str
    capacity: int
    free: int

    kind_prefix: ClassVar[str] = "engines/memory/"

    def key(self) -> str:
        return self._key(check_name(self.node, "node"), check_name(self.engine, "engine"))


@dataclasses.dataclass(frozen=True)
class NetworkEngineInfo(Record):
    """A network engine of a node: protocol and measured bandwidth (GB/s) / latency (µs)."""

    node: str
    engine: str
    protocol: str
    bandwidth_gbps: float
    latency_us: float

    kind_prefix: ClassVar[str] = "engines/network/"

    def key(self) -> str:
        return self._key(check_name(self.node, "node"), check_name(self.engine, "engine"))


@dataclasses.dataclass(frozen=True)
class Binding(Record):
    """Compute-storage binding: the memory engine an op engine of the node computes on."""

    node: str
    op_engine: str
    memory_engine: str

    kind_prefix: ClassVar[str] = "bindings/"

    def key(self) -> str:
        return self._key(check_name(self.node, "node"), check_name(self.op_engine, "op engine"))


@dataclasses.dataclass(frozen=True)
class Drained(Record):
    """A node an admin drained: no new tasks go there (running ones finish) until it is
    undrained. Written without a lease, so it outlives a restart of the node or of the
    scheduler, and every scheduler replica reads the same."""

    node: str
    at: float
    by: str

    kind_prefix: ClassVar[str] = "drained/"

    def key(self) -> str:
        return self._key(check_name(self.node, "node"))


R = TypeVar("R", bound=Record)


def encode(record: Record) -> bytes:
    """Canonical JSON bytes of ``record`` (validates its names through ``key()``)."""
    record.key()
    data = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _check_field(cls_name: str, name: str, hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{cls_name}.{name} must be a list of str, got {value!r}")
        return tuple(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{cls_name}.{name} must be a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{cls_name}.{name} must be an int, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(f"{cls_name}.{name} must be a str, got {value!r}")
        return value
    if isinstance(hint, types.UnionType):  # pragma: no cover - no optional fields yet
        return value
    raise TypeError(f"{cls_name}.{name}: unsupported field type {hint!r}")


@functools.cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """A record class's fields with their resolved type hints. Resolving the hints
    (``typing.get_type_hints``) costs about 100 µs a class, paid once here rather than for
    every record decoded: the scheduler decodes each executor's op engines per submit."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls))


def decode(cls: type[R], raw: bytes, *, key: str = "?") -> R:
    """The record of type ``cls`` in ``raw``; :class:`RecordError` naming ``key`` if malformed.

    Unknown extra fields are ignored (a newer writer may add some); missing ones are errors,
    but for fields with a default (added later: an older writer's record lacks them).
    """
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        values = {}
        for f, hint in _fields(cls):
            if f.name not in data:
                if f.default is not dataclasses.MISSING:
                    continue  # a field added later, with a default: an older writer's record
                raise KeyError(f"missing field {f.name!r}")
            values[f.name] = _check_field(cls.__name__, f.name, hint, data[f.name])
        record = cls(**values)
        if record.key() != key and key != "?":
            raise ValueError(f"its fields belong under {record.key()!r}")
        return record
    except (ValueError, TypeError, KeyError) as exc:
        raise RecordError(f"registry key {key!r}: malformed {cls.__name__}: {exc}") from exc
