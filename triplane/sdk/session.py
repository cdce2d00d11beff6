"""Where graphs run: the session.

The default session is embedded: graphs compile with the full pass pipeline (plans
cached by canonical graph hash, so a training loop compiles once) and run in this process
on the numpy engine, freeing buffers per the memory plan. ``tp.connect`` (the
distributed-runtime issue) swaps in a session that submits to a cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from triplane.proto.errors import KernelError
from triplane.scheduler.compiler.pipeline import CompileOptions, PlanCache, canonicalize

if TYPE_CHECKING:
    from triplane.sdk.tensor import Tensor


class EmbeddedSession:
    """Compiles and runs graphs in-process."""

    def __init__(self, engine: str = "numpy", options: CompileOptions | None = None) -> None:
        from triplane.engines.registry import get_op_engine

        self.engine = get_op_engine(engine)
        self.options = options or CompileOptions()
        self.plans = PlanCache()
        self.last_stats: dict[str, Any] = {}

    def evaluate(self, outputs: Sequence[Tensor]) -> list[np.ndarray]:
        from triplane.executor.local import run_plan
        from triplane.sdk.tensor import build_graph

        graph, tensors, bindings = build_graph(outputs)
        cgraph, rename, args = canonicalize(graph)
        plan = self.plans.get_or_compile(cgraph, self.options)
        stats: dict[str, Any] = {}
        try:
            results = run_plan(plan, {f"arg{i}": bindings[a] for i, a in enumerate(args)},
                               self.engine, stats)
        except KernelError as e:
            raise _locate(e, rename, tensors) from None
        stats.update(planned_peak_bytes=plan.memory.peak_bytes, nodes=len(plan.graph))
        self.last_stats = stats
        return [np.asarray(results[rename[t._id]]) for t in outputs]


def _locate(e: KernelError, rename: dict[str, str], tensors: dict[str, Tensor]) -> KernelError:
    """Name the user's line that made the node a kernel failed on."""
    back = {v: k for k, v in rename.items()}
    t = tensors.get(back.get(e.node or "", ""))
    where = f" (made at {t._where})" if t is not None and t._where else ""
    msg, prefix = str(e), f"node {e.node!r} ({e.op}): "
    if e.node and msg.startswith(prefix):  # KernelError adds it again: say it once
        msg = msg[len(prefix):]
    return KernelError(f"{msg}{where}", node=e.node, op=e.op, kind=e.kind)


_local = threading.local()
_default: EmbeddedSession | None = None


def current_session() -> Any:
    """The session of this thread (set by ``use_session``), else the process default."""
    s = getattr(_local, "session", None)
    if s is not None:
        return s
    global _default
    if _default is None:
        _default = EmbeddedSession()
    return _default


def set_default_session(session: Any | None) -> Any:
    """Make ``session`` the process default (``None``: a fresh embedded session on next
    use); returns the previous default. ``tp.connect`` uses this."""
    global _default
    prev, _default = _default, session
    return prev


class use_session:
    """``with use_session(s): ...`` runs graphs on ``s`` in this thread."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def __enter__(self) -> Any:
        self._prev = getattr(_local, "session", None)
        _local.session = self.session
        return self.session

    def __exit__(self, *exc: object) -> None:
        _local.session = self._prev
