"""Finding engines by name: one path for op, memory and network engines.

Built-ins first (a dict per kind), then installed plugins: a distribution declares an
entry point in the group ``triplane.engines.<kind>`` (``op``, ``memory``, ``network``)
whose name is the engine's and whose object makes one (a class or a factory)::

    [project.entry-points."triplane.engines.memory"]
    redis = "my_package.engine:RedisMemoryEngine"

A built-in wins over a plugin of the same name. An unknown name raises
:class:`~triplane.engines.errors.UnknownEngineError` listing the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from triplane.engines.errors import UnknownEngineError
from triplane.engines.protocols import MemoryEngine, OpEngine, mismatches

__all__ = [
    "BUILTINS", "KINDS", "engine_factory", "engine_names", "get_memory_engine",
    "get_network_engine", "get_op_engine", "memory_engine_names", "op_engine_names",
]

KINDS = ("op", "memory", "network")

BUILTINS: dict[str, dict[str, str]] = {
    "op": {
        "numpy": "triplane.engines.op.numpy_engine:NumpyEngine",
        "cupy": "triplane.engines.op.cupy_engine:CupyEngine",
    },
    "memory": {
        "host": "triplane.engines.memory.host:HostMemoryEngine",
        "file": "triplane.engines.memory.file:FileMemoryEngine",
        "redis": "triplane.engines.memory.redis_engine:RedisMemoryEngine",
        "device": "triplane.engines.memory.device:DeviceMemoryEngine",
        "spill": "triplane.engines.memory.spill:SpillingMemoryEngine",
    },
    "network": {
        "tcp": "triplane.engines.network.tcp:TcpEngine",
        "udp": "triplane.engines.network.udp:UdpEngine",
    },
}

_op_cache: dict[str, Any] = {}


def _group(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown engine kind {kind!r} (known: {list(KINDS)})")
    return f"triplane.engines.{kind}"


def engine_names(kind: str) -> list[str]:
    """The names of the built-in and installed engines of ``kind``, sorted."""
    group = _group(kind)
    names = set(BUILTINS[kind]) | {ep.name for ep in entry_points(group=group)}
    return sorted(names)


def engine_factory(kind: str, name: str) -> Callable[..., Any]:
    """What makes the engine ``name`` of ``kind`` (``op``, ``memory``, ``network``): the
    built-in of that name, else the installed entry point's object. UnknownEngineError
    (listing the known names) if neither exists."""
    group = _group(kind)
    spec = BUILTINS[kind].get(name)
    if spec is not None:
        module, _, attr = spec.partition(":")
        return getattr(import_module(module), attr)
    eps = [ep for ep in entry_points(group=group) if ep.name == name]
    if not eps:
        raise UnknownEngineError(f"unknown {kind} engine {name!r} (known: {engine_names(kind)})")
    return eps[0].load()


def op_engine_names() -> list[str]:
    return engine_names("op")


def memory_engine_names() -> list[str]:
    return engine_names("memory")


def get_op_engine(name: str = "numpy", **options: Any) -> OpEngine:
    """An op engine by name (``numpy``, ``cupy``, or a plugin's name), made once per
    name and options: op engines are stateless, so one instance serves a process."""
    key = name if not options else f"{name}:{sorted(options.items())}"
    engine = _op_cache.get(key)
    if engine is None:
        engine = _op_cache[key] = engine_factory("op", name)(**options)
    return engine


def get_memory_engine(name: str = "host", *, capacity: int, **options: Any) -> MemoryEngine:
    """A new memory engine by name (``host``, or a plugin's name) of ``capacity`` bytes.
    TypeError if what the name makes does not implement :class:`MemoryEngine`."""
    engine = engine_factory("memory", name)(capacity=capacity, **options)
    problems = mismatches(engine, MemoryEngine)
    if problems:
        raise TypeError(f"memory engine {name!r} ({type(engine).__name__}) does not implement the "
                        f"MemoryEngine protocol: {'; '.join(problems)}")
    return engine


def get_network_engine(name: str, **options: Any) -> Any:
    """A new network engine by name (``tcp``, ``udp``, or a plugin's name)."""
    return engine_factory("network", name)(**options)
