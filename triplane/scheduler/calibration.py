"""How fast each executor's kernels run now, learned from the tasks it finishes (pure).

An executor registers the rates it measured when it started (``gflops``, ``gbps``), and
the tiler and placement predict every task from them. A machine's speed drifts: on a
shared VM here the same matmul ran 40% slower for minutes at a time, and two executors
on two cores run slower together than one alone. Predictions from start-up figures were
then off by up to 2x, and the plan is meant to be read beside the actual times.

So the scheduler compares each finished task's kernel time with its prediction and keeps,
per executor and per roofline bound (``"flops"``: matmul-like, ``"bytes"``: elementwise,
fused), a factor ``actual / predicted`` as an exponentially weighted average in log space.
A task's weight is ``1 - exp(-predicted / tau_s)``: a 1 s kernel counts for much, a 1 ms
one for almost nothing, and tasks predicted under ``min_predicted_s`` are skipped (their
time is overhead and noise). Each observation's ratio is clamped to ``[lo, hi]`` so one
freak (a page-fault storm, a stalled VM) cannot throw the figures far.

:meth:`Calibration.apply` divides the registered rates by the factors before a submit
plans with them. Factors are rounded to steps of ``step`` (5%) so that a steady machine
gives the same figures job after job (the plan record is keyed by them). The factors a
job was planned with are kept with it (:meth:`snapshot`), so what its tasks teach is
measured against the registered rates, not against an already-corrected prediction.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

from triplane.scheduler.compiler.costmodel import NodeFigures, TaskCost

__all__ = ["Bound", "Calibration", "bound_of"]

Bound = Literal["flops", "bytes"]
Factors = Mapping[str, tuple[float, float]]  # node -> (flops factor, bytes factor)


def bound_of(cost: TaskCost, node: NodeFigures) -> Bound:
    """Which side of the roofline a task's predicted time came from on ``node``."""
    return "flops" if cost.flops / node.gflops >= cost.bytes / node.gbps else "bytes"


class Calibration:
    """Per (executor, bound): the factor by which kernels run slower than registered."""

    def __init__(self, *, tau_s: float = 2.0, min_predicted_s: float = 0.005, lo: float = 0.25,
                 hi: float = 4.0, step: float = 0.05) -> None:
        if not (tau_s > 0 and min_predicted_s >= 0 and 0 < lo <= 1 <= hi and step > 0):
            raise ValueError("calibration needs tau_s > 0, min_predicted_s >= 0, 0 < lo <= 1 <= hi, step > 0")
        self.tau_s, self.min_predicted_s, self.lo, self.hi = tau_s, min_predicted_s, lo, hi
        self._step = math.log1p(step)
        self._log: dict[tuple[str, Bound], float] = {}  # log of the factor
        self._lock = threading.Lock()  # observed on the loop, read by a submit's thread

    def observe(self, node: str, bound: Bound, predicted_s: float, actual_s: float,
                planned_factor: float = 1.0) -> None:
        """A kernel predicted to take ``predicted_s`` (with ``planned_factor`` already
        applied) took ``actual_s`` on ``node``."""
        if not (predicted_s >= self.min_predicted_s and actual_s > 0 and planned_factor > 0):
            return
        ratio = min(self.hi, max(self.lo, actual_s / predicted_s * planned_factor))
        w = 1.0 - math.exp(-predicted_s / self.tau_s)
        key = (node, bound)
        with self._lock:
            old = self._log.get(key, 0.0)
            self._log[key] = (1.0 - w) * old + w * math.log(ratio)

    def factor(self, node: str, bound: Bound) -> float:
        """The learned factor, rounded to the step (1.0: nothing learned, or on time)."""
        with self._lock:
            x = self._log.get((node, bound), 0.0)
        return math.exp(round(x / self._step) * self._step)

    def snapshot(self, nodes: Sequence[str]) -> dict[str, tuple[float, float]]:
        return {n: (self.factor(n, "flops"), self.factor(n, "bytes")) for n in nodes}

    def apply(self, figures: Sequence[NodeFigures], factors: Factors | None = None) -> list[NodeFigures]:
        """``figures`` with each node's rates divided by its factors (``factors``: a
        :meth:`snapshot`; default the current ones)."""
        if factors is None:
            factors = self.snapshot([f.name for f in figures])
        out = []
        for f in figures:
            ff, fb = factors.get(f.name, (1.0, 1.0))
            out.append(f if ff == fb == 1.0 else replace(f, gflops=f.gflops / ff, gbps=f.gbps / fb))
        return out

    def forget(self, node: str) -> None:
        """``node`` is gone: a new executor under its name starts from its own figures."""
        with self._lock:
            for b in ("flops", "bytes"):
                self._log.pop((node, b), None)
