"""The compile pipeline and the plan cache."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from triplane.proto.ir import Graph
from triplane.proto.validate import DEFAULT_LIMITS, Limits, validate
from triplane.scheduler.compiler.dce import dce
from triplane.scheduler.compiler.memory import MemoryPlan, plan_memory

Pass = Callable[[Graph], Graph]


@dataclass(frozen=True)
class CompileOptions:
    """Which optimisation passes run (all by default). ``fold``: constant folding,
    elementwise ops reading a ``broadcast_to`` read its input instead (numpy broadcasting),
    and transposes move onto matmul operands (``compiler/transposes.py``)."""

    cse: bool = True
    fold: bool = True
    fuse: bool = True
    limits: Limits = DEFAULT_LIMITS


@dataclass(frozen=True)
class Plan:
    """A compiled graph and its memory plan. ``source`` is the validated input graph."""

    graph: Graph
    memory: MemoryPlan
    source: Graph
    passes: tuple[str, ...] = field(default=())


def passes_for(options: CompileOptions) -> list[tuple[str, Pass]]:
    chosen: list[tuple[str, Pass]] = [("dce", dce)]
    if options.cse:
        from triplane.scheduler.compiler.cse import cse

        chosen.append(("cse", cse))
    if options.fold:
        from triplane.scheduler.compiler.broadcasts import fold_broadcasts
        from triplane.scheduler.compiler.fold import fold_constants
        from triplane.scheduler.compiler.transposes import fold_transposes

        chosen.append(("fold", fold_constants))
        chosen.append(("broadcasts", fold_broadcasts))
        chosen.append(("transposes", fold_transposes))
        chosen.append(("dce", dce))
    if options.fuse:
        from triplane.scheduler.compiler.fusion import fuse_elementwise

        chosen.append(("fuse", fuse_elementwise))
    return chosen


def compile_graph(graph: Graph, options: CompileOptions | None = None) -> Plan:
    """Validate, optimise and plan ``graph``. Raises GraphError on a malformed graph."""
    options = options or CompileOptions()
    source = validate(graph, options.limits)
    g = source
    names = []
    for name, p in passes_for(options):
        g = p(g)
        names.append(name)
    return Plan(g, plan_memory(g), source, tuple(names))


class PlanCache:
    """An LRU cache of compiled plans keyed by canonical graph hash."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def holds(self, graph: Graph, options: CompileOptions | None = None) -> bool:
        """Whether :meth:`get_or_compile` would find the plan (without counting a hit)."""
        return graph.hash() + (repr(options) if options else "") in self._plans

    def get_or_compile(self, graph: Graph, options: CompileOptions | None = None) -> Plan:
        key = graph.hash() + (repr(options) if options else "")
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return plan
        plan = compile_graph(graph, options)
        with self._lock:
            self.misses += 1
            self._plans[key] = plan
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)
        return plan
