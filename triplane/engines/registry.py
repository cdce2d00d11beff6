"""Finding engines by name: one path for op, memory and network engines.

Built-ins first (a dict per kind), then installed plugins: a distribution declares an
entry point in the group ``triplane.engines.<kind>`` (``op``, ``memory``, ``network``)
whose name is the engine's and whose object makes one (a class or a factory)::

    [project.entry-points."triplane.engines.memory"]
    redis = "my_package.engine:RedisMemoryEngine"

A built-in wins over a plugin of the same name. An unknown name raises
:class:`~triplane.engines.errors.UnknownEngineError` listing the known ones.

User ops travel the same way: an entry point in the group ``triplane.ops`` names a list
(or a function returning one) of :class:`~triplane.proto.opdef.OpDef`;
:func:`load_op_plugins` puts them in the op table of every process that starts (the
scheduler validates and places them, the executor's engines declare them). Their kernels
come from an op engine plugin that ``supports`` them. A plugin that fails to load is
isolated: :func:`load_op_plugins` and :func:`installed_op_engines` return its problem
(:class:`PluginProblem`) instead of raising, and the process goes on without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from triplane.engines.errors import UnknownEngineError
from triplane.engines.protocols import MemoryEngine, OpEngine, mismatches
from triplane.proto import optable
from triplane.proto.opdef import OpDef

__all__ = [
    "BUILTINS", "KINDS", "OPS_GROUP", "PluginProblem", "engine_factory", "installed_op_engines",
    "load_op_plugins", "engine_names", "get_memory_engine",
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

OPS_GROUP = "triplane.ops"

_op_cache: dict[str, Any] = {}
_op_plugins: list[PluginProblem] | None = None


@dataclass(frozen=True)
class PluginProblem:
    """A plugin isolated by the process that tried to use it: what (``kind`` op, memory,
    network or ops; ``name``), and why (``message``, naming the exception)."""

    kind: str
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} plugin {self.name!r}: {self.message}"

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "message": self.message}


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


def load_op_plugins() -> list[PluginProblem]:
    """Put the op definitions of every installed ``triplane.ops`` entry point in the op
    table (once a process; later calls return the first call's problems). A plugin that
    raises, gives something other than OpDefs, or names an op the table already holds is
    left out, with its problem in the list."""
    global _op_plugins
    if _op_plugins is not None:
        return list(_op_plugins)
    problems: list[PluginProblem] = []
    optable.names()  # the built-ins first: a plugin cannot shadow one
    for ep in entry_points(group=OPS_GROUP):
        try:
            got = ep.load()
            defs = list(got() if callable(got) else got)
            bad = [d for d in defs if not isinstance(d, OpDef)]
            if bad:
                raise TypeError(f"gave {type(bad[0]).__name__}, not OpDef")
            taken = [d.name for d in defs if d.name in optable.names()]
            if taken:
                raise ValueError(f"op(s) {taken} already in the op table")
        except Exception as e:  # a plugin must not stop the process: report it
            problems.append(PluginProblem("ops", ep.name, f"{type(e).__name__}: {e}"))
            continue
        for d in defs:
            optable.register(d)
    _op_plugins = problems
    return list(problems)


def installed_op_engines() -> tuple[list[str], list[PluginProblem]]:
    """The op engines a node starts with when none are named (``--engines auto``): numpy,
    then every installed ``triplane.engines.op`` plugin that loads and can be made, in
    name order; and the problems of those that cannot."""
    names, problems = ["numpy"], []
    for name in sorted({ep.name for ep in entry_points(group=_group("op"))} - set(BUILTINS["op"])):
        try:
            get_op_engine(name)
        except Exception as e:
            problems.append(PluginProblem("op", name, f"cannot be made: {type(e).__name__}: {e}"))
            continue
        names.append(name)
    return names, problems
