"""What the SDK is given from the top of the package: the embedded session, and where
``triplane up`` recorded its cluster.

The SDK sits beside the compiler and the executor and below the launcher (docs/layout.md),
so it imports none of them. This module, above all three, builds the embedded session from
them (compile with the full pass pipeline, plans cached by canonical graph hash so a
training loop compiles once, run in this process on an op engine, freeing buffers as the
memory plan says) and reads the launcher's run directory for ``tp.connect``.
:func:`install` hands both to the SDK; ``triplane/__init__.py`` calls it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from triplane.engines.registry import get_op_engine
from triplane.executor.local import KernelList
from triplane.proto.errors import KernelError
from triplane.scheduler.compiler.pipeline import CompileOptions, Plan, PlanCache
from triplane.sdk import remote, session
from triplane.sdk.compile import TraceCache, signature

if TYPE_CHECKING:
    from triplane.sdk.tensor import Tensor

__all__ = ["EmbeddedSession", "install", "local_cluster"]


@dataclass(frozen=True)
class CompiledStep:
    """What the embedded session keeps per graph structure (``sdk.compile.signature``):
    the plan's kernel list, which walked input binds each ``argN`` (``args[N]`` is its
    position among the walk's inputs), the plan node of each output, and the walk
    position of each plan node (to name the user's line when a kernel fails)."""

    plan: Plan
    kernels: KernelList
    args: tuple[int, ...]
    outputs: tuple[str, ...]
    walk_of: dict[str, int]
    names: tuple[str, ...] = ()  # the input names the plan binds: arg0, arg1, ...


class EmbeddedSession:
    """Compiles and runs graphs in this process (the default session).

    A graph whose structure was run before replays that compiled step: its kernel list
    with the new input values, without building, canonicalising, hashing, validating or
    planning a graph (``counters()`` shows the trace and plan caches' hits and misses)."""

    def __init__(self, engine: str = "numpy", options: CompileOptions | None = None) -> None:
        self.engine = get_op_engine(engine)
        self.options = options or CompileOptions()
        self.plans = PlanCache()
        self.traces: TraceCache[CompiledStep] = TraceCache()
        self.last_stats: dict[str, Any] = {}

    def evaluate(self, outputs: Sequence[Tensor]) -> list[np.ndarray]:
        key, walk, inputs = signature(outputs)
        step = self.traces.get(key)
        if step is None:
            step = self._compile(outputs, walk, inputs)
            self.traces.put(key, step)
        bindings = {name: inputs[p]._value for name, p in zip(step.names, step.args)}
        stats: dict[str, Any] = {}
        try:
            results = step.kernels.run(bindings, stats)
        except KernelError as e:
            rename = {walk[p]._id: nid for nid, p in step.walk_of.items()}
            raise session.locate_kernel_error(e, rename, {t._id: t for t in walk}) from None
        stats.update(planned_peak_bytes=step.plan.memory.peak_bytes, nodes=len(step.plan.graph))
        self.last_stats = stats
        return [np.asarray(results[o]) for o in step.outputs]

    def _compile(self, outputs: Sequence[Tensor], walk: list[Tensor], inputs: list[Tensor]) -> CompiledStep:
        from triplane.sdk.tensor import build_graph

        graph, _, _ = build_graph(outputs)
        cgraph, rename, args = graph.canonical()
        plan = self.plans.get_or_compile(cgraph, self.options)
        at_input = {t._id: i for i, t in enumerate(inputs)}
        return CompiledStep(plan, KernelList(plan, self.engine), tuple(at_input[a] for a in args),
                            tuple(rename[t._id] for t in outputs),
                            {rename[t._id]: i for i, t in enumerate(walk)},
                            tuple(f"arg{i}" for i in range(len(args))))

    def counters(self) -> dict[str, int]:
        """Compiled steps replayed (``trace_hits``) and compiled (``trace_misses``); plans
        found by canonical hash (``plan_hits``) and planned (``plan_misses``)."""
        return {"trace_hits": self.traces.hits, "trace_misses": self.traces.misses,
                "plan_hits": self.plans.hits, "plan_misses": self.plans.misses}


def local_cluster(home: str | os.PathLike[str] | None = None) -> remote.LocalCluster:
    """The cluster ``triplane up`` recorded in the run directory ``home`` (default
    ``TRIPLANE_HOME``, else ``~/.triplane``): its URL and token, or no URL when none is
    recorded (or the record is malformed)."""
    from triplane.launcher.rundir import RunDir

    run = RunDir(home)
    info = run.read_cluster()
    if info is None:
        return remote.LocalCluster(None, None, str(run.path))
    return remote.LocalCluster(str(info["url"]), run.read_token(), str(run.path))


def install() -> None:
    """Make the embedded session the SDK's default and let ``tp.connect`` find the cluster
    of ``triplane up``."""
    session.set_session_factory(EmbeddedSession)
    remote.set_local_cluster_lookup(local_cluster)
