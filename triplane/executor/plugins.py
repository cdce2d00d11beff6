"""An executor's engines, made from names with every plugin isolated.

A plugin that raises when loaded or made, fails the op-engine conformance kit at start
(wrong shapes, dtypes or values on the ops it declares), or whose memory engine lies
about its capacity is left out: the node starts with its other engines (the host memory
engine in place of a bad memory engine) and the problem goes to its log (``plugin
isolated: ...``), to the registry (``plugins`` of the node's ``stats/<node>`` record,
under its lease) and to ``triplane status``. An op engine that returns a wrong shape or dtype
while serving fails that task as an infrastructure error naming the engine, never
passing the array on.

``--engines auto`` (the default of ``triplane executor``) is numpy and every installed
``triplane.engines.op`` plugin, in the manner of PyTorch's out-of-tree backend autoload.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from triplane.engines.errors import UnknownEngineError
from triplane.engines.protocols import mismatches
from triplane.engines.registry import (
    BUILTINS,
    PluginProblem,
    get_memory_engine,
    get_network_engine,
    get_op_engine,
    installed_op_engines,
    load_op_plugins,
)
from triplane.engines.testing import run_cases
from triplane.proto.errors import KernelError
from triplane.proto.ir import TensorType

__all__ = ["CheckedEngine", "make_memory_engine", "make_network_engines", "make_op_engines"]

log = logging.getLogger(__name__)


def _isolate(problems: list[PluginProblem], problem: PluginProblem) -> None:
    problems.append(problem)
    log.error("plugin isolated: %s", problem)


class CheckedEngine:
    """A plugin op engine whose every result is checked against the node's shape and dtype.
    After its first wrong result it is isolated: it supports nothing (the node's other
    engines take its ops) and a task still sent to it fails as an infrastructure error."""

    def __init__(self, engine: Any, problems: list[PluginProblem]) -> None:
        self.engine, self.problems = engine, problems
        self.name, self.device = engine.name, getattr(engine, "device", "cpu")
        self.ops = getattr(engine, "ops", None)
        self.reported = False

    def supports(self, op: str, dtypes: Sequence[str] = ()) -> bool:
        return not self.reported and self.engine.supports(op, dtypes)

    def benchmark(self, *args: Any, **kwargs: Any) -> Mapping[str, float]:
        return self.engine.benchmark(*args, **kwargs)

    def run(self, op: str, inputs: Sequence[Any], attrs: Mapping[str, Any], out: TensorType) -> Any:
        if self.reported:
            raise KernelError(f"engine {self.name!r} is isolated: {self.problems[-1].message}", op=op,
                              kind="infra")
        result = self.engine.run(op, inputs, attrs, out)
        shape, dtype = tuple(getattr(result, "shape", ())), str(getattr(result, "dtype", "?"))
        if shape != tuple(out.shape) or dtype != out.dtype.name:
            message = (f"engine {self.name!r} returned {dtype}{list(shape)} for {op}, expected "
                       f"{out.dtype.name}{list(out.shape)}")
            if not self.reported:
                self.reported = True
                _isolate(self.problems, PluginProblem("op", self.name, message))
            raise KernelError(message, op=op, kind="infra")
        return result


def make_op_engines(names: Sequence[str], problems: list[PluginProblem]) -> list[Any]:
    """The op engines named (``auto``: numpy and every installed plugin), each plugin
    checked by the conformance kit first. UnknownEngineError for a name nothing provides;
    ValueError when no engine is left."""
    for p in load_op_plugins():
        _isolate(problems, p)
    wanted: list[str] = []
    for name in names:
        if name == "auto":
            found, failed = installed_op_engines()
            wanted += found
            for p in failed:
                _isolate(problems, p)
        else:
            wanted.append(name)
    engines = []
    for name in dict.fromkeys(wanted):
        try:
            engine = get_op_engine(name)
        except UnknownEngineError:
            raise
        except Exception as e:  # import error, a factory that raises: isolate it
            _isolate(problems, PluginProblem("op", name, f"cannot be made: {type(e).__name__}: {e}"))
            continue
        if name in BUILTINS["op"]:
            engines.append(engine)
            continue
        failed = [r for r in run_cases(engine, float_dtypes=("float32",), rng=np.random.default_rng(0))
                  if not r.ok]
        if failed:
            detail = "; ".join(f"{r.case.op} ({r.dtype}): {r.message}" for r in failed[:3])
            _isolate(problems, PluginProblem("op", name, f"fails the conformance kit on {len(failed)} "
                                                         f"case(s): {detail}"))
            continue
        engines.append(CheckedEngine(engine, problems))
    if not engines:
        raise ValueError(f"no usable op engine among {list(names)}: "
                         + "; ".join(str(p) for p in problems))
    return engines


def make_memory_engine(name: str, capacity: int, problems: list[PluginProblem],
                       options: dict[str, Any] | None = None) -> Any:
    """The memory engine ``name`` of ``capacity`` bytes (with the built-in's ``options``:
    a file engine's directory, a spilling engine's tiers); a plugin that cannot be made or
    whose accounting is dishonest (capacity or free bytes other than asked, a probe tile
    not counted) is replaced by the host engine, with its problem recorded. The built-ins
    pass the memory conformance kit instead (a file engine reopened on its directory is
    not empty, and is not lying)."""
    try:
        engine = get_memory_engine(name, capacity=capacity, **(options or {}))
    except UnknownEngineError:
        raise
    except Exception as e:
        if name == "host":
            raise
        _isolate(problems, PluginProblem("memory", name, f"cannot be made: {type(e).__name__}: {e}; "
                                                         "using the host engine"))
        return get_memory_engine("host", capacity=capacity)
    if name in BUILTINS["memory"]:
        return engine
    lie = _accounting_lie(engine, capacity)
    if lie:
        _isolate(problems, PluginProblem("memory", name, f"{lie}; using the host engine"))
        return get_memory_engine("host", capacity=capacity)
    return engine


def make_network_engines(names: Sequence[str], problems: list[PluginProblem]) -> list[Any]:
    """The network engines named, in order (the first measures the node's links). A plugin
    that cannot be made or does not implement the NetworkEngine protocol is isolated (the
    next engine measures); a built-in that does not is a TypeError, an unknown name
    UnknownEngineError."""
    from triplane.engines.network.base import NetworkEngine

    engines = []
    for name in dict.fromkeys(names):
        try:
            engine = get_network_engine(name)
            wrong = mismatches(engine, NetworkEngine)
            if wrong:
                raise TypeError(f"network engine {name!r} ({type(engine).__name__}) does not implement the "
                                f"NetworkEngine protocol: {'; '.join(wrong)}")
        except UnknownEngineError:
            raise
        except Exception as e:
            if name in BUILTINS["network"]:
                raise
            _isolate(problems, PluginProblem("network", name, f"cannot be used: {type(e).__name__}: {e}"))
            continue
        engines.append(engine)
    return engines


def _accounting_lie(engine: Any, capacity: int) -> str | None:
    try:
        if engine.capacity() != capacity:
            return f"claims a capacity of {engine.capacity()} bytes, {capacity} were asked"
        if engine.free() > capacity or engine.used() != 0:
            return f"claims {engine.free()} bytes free and {engine.used()} used of {capacity} when empty"
        probe = np.zeros(min(1024, max(capacity // 4, 1)) // 4 * 4 or 4, dtype=np.uint8)
        engine.put("_plugin_probe", probe)
        used, free = engine.used(), engine.free()
        engine.delete("_plugin_probe")
        if used != probe.nbytes or free > capacity - probe.nbytes:
            return (f"after a {probe.nbytes}-byte tile reports {used} bytes used and {free} free "
                    f"of {capacity}")
    except Exception as e:
        return f"failed the capacity probe: {type(e).__name__}: {e}"
    return None
