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
from typing import TYPE_CHECKING, Any

import numpy as np

from triplane.engines.registry import get_op_engine
from triplane.executor.local import run_plan
from triplane.proto.errors import KernelError
from triplane.scheduler.compiler.pipeline import CompileOptions, PlanCache
from triplane.sdk import remote, session

if TYPE_CHECKING:
    from triplane.sdk.tensor import Tensor

__all__ = ["EmbeddedSession", "install", "local_cluster"]


class EmbeddedSession:
    """Compiles and runs graphs in this process (the default session)."""

    def __init__(self, engine: str = "numpy", options: CompileOptions | None = None) -> None:
        self.engine = get_op_engine(engine)
        self.options = options or CompileOptions()
        self.plans = PlanCache()
        self.last_stats: dict[str, Any] = {}

    def evaluate(self, outputs: Sequence[Tensor]) -> list[np.ndarray]:
        from triplane.sdk.tensor import build_graph

        graph, tensors, bindings = build_graph(outputs)
        cgraph, rename, args = graph.canonical()
        plan = self.plans.get_or_compile(cgraph, self.options)
        stats: dict[str, Any] = {}
        try:
            results = run_plan(plan, {f"arg{i}": bindings[a] for i, a in enumerate(args)},
                               self.engine, stats)
        except KernelError as e:
            raise session.locate_kernel_error(e, rename, tensors) from None
        stats.update(planned_peak_bytes=plan.memory.peak_bytes, nodes=len(plan.graph))
        self.last_stats = stats
        return [np.asarray(results[rename[t._id]]) for t in outputs]


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
