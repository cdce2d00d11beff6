"""The dispatcher's mutable records (tasks, jobs, nodes), its knobs and its transition table.

Task states are :class:`triplane.proto.states.TaskState` -- the same values the metadb
stores and the API shows. ``TRANSITIONS`` lists every (start, finish) pair the state
machine may take (``docs/scheduler.md`` draws them); any other raises
``InvalidTransition``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from triplane.proto.states import TERMINAL_TASK_STATES, TaskState
from triplane.scheduler.dispatch.events import TaskFailure, TaskSpec, Transitioned

__all__ = ["TERMINAL", "TRANSITIONS", "InvalidTransition", "JobRecord", "NodeRecord", "Policy",
           "TaskRecord"]

PENDING, READY, DISPATCHED = TaskState.PENDING, TaskState.READY, TaskState.DISPATCHED
DONE, FAILED, CANCELLED = TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED
TERMINAL = TERMINAL_TASK_STATES

TRANSITIONS: frozenset[tuple[TaskState, TaskState]] = frozenset({
    (PENDING, READY), (READY, DISPATCHED), (DISPATCHED, DONE),
    (DISPATCHED, READY), (DISPATCHED, PENDING),  # drift
    (DONE, READY), (DONE, PENDING), (READY, PENDING),  # lineage recompute
    (PENDING, FAILED), (READY, FAILED), (DISPATCHED, FAILED),
    (PENDING, CANCELLED), (READY, CANCELLED), (DISPATCHED, CANCELLED),
})


class InvalidTransition(RuntimeError):
    pass


@dataclass
class TaskRecord:
    job: str
    spec: TaskSpec
    state: TaskState = PENDING
    attempt: int = 0
    node: str | None = None           # where it runs / its output lives
    resend_at: float = 0.0            # retransmit the current attempt at this time
    due: float = 0.0                  # the current attempt's run deadline (acks do not move it)
    started: bool = False             # the executor reported the current attempt's kernel start
    overruns: int = 0                 # attempts drifted for running past their run deadline
    sends: int = 0                    # transmissions of the current attempt
    not_before: float = 0.0           # placed again no earlier than this (retry backoff)
    excluded: set[str] = field(default_factory=set)  # nodes that failed it (infra)
    waiting_on: set[str] = field(default_factory=set)
    dependents: set[str] = field(default_factory=set)
    error: TaskFailure | None = None
    log: list[Transitioned] = field(default_factory=list)


@dataclass
class JobRecord:
    id: str
    tasks: dict[str, TaskRecord]
    state: Literal["running", "done", "failed", "cancelled"] = "running"
    remaining: int = 0
    seq: int = 0  # submission order: an earlier job's ready tasks go first
    deadline: float | None = None  # the user's: the job fails (kind "deadline") after it
    submitted: float = 0.0
    persist: str | None = None  # kind of the persistence target keeping its tiles (or None)


@dataclass
class NodeRecord:
    name: str
    slots: int
    alive: bool = True
    running: set[tuple[str, str]] = field(default_factory=set)  # (job, task)


@dataclass(frozen=True)
class Policy:
    """Knobs of the dispatcher.

    Retransmission: an attempt unanswered for ``max(min_timeout_s, deadline_factor *
    cost_s)`` is sent again (same attempt); after ``max_sends`` sends without a reply or an
    ack it drifts to another node; after ``max_attempts`` attempts it fails. A drifted task
    waits ``retry_backoff_s * 2**(attempt - 1)`` (at most ``max_backoff_s``) before it is
    placed again, so a transient fault (a registry restarting, a peer not yet known dead)
    does not burn every attempt in a millisecond.

    Run deadline (docs/scheduler.md, "Deadlines"): an attempt must reply within
    ``run_budget`` = ``(run_slack_s + deadline_factor * cost_s) * 2**overruns`` of its
    dispatch (or, once, of its kernel's reported start). Acks do not move it: a kernel
    hung on a live executor that keeps acknowledging drifts when it passes. Each attempt
    drifted so doubles the next one's budget, so a task the cost model predicted far too
    short still gets to finish (within ``max_attempts``).

    A node runs ``slots`` tasks at once (``NodeUp``), and up to ``small_slots`` when the
    extra ones are *small*: predicted under ``small_task_s`` with outputs of at most
    ``small_task_bytes``. A round trip of such a task is mostly waking the processes at
    both ends; with more of them queued an executor runs them back to back instead of
    sleeping between packets (measured on the 10,000-task benchmark, 2 executors: 16
    rather than 4 in flight cut the executors' CPU time per job by about a quarter). A
    task that is not small still waits until fewer than ``slots`` run there, and a
    *heavy* one (predicted at least ``heavy_task_s``) until fewer than ``heavy_slots``:
    an executor runs its kernels one after another, so a heavy task sent behind three
    others waits for them all, however urgent it is (the MLP step: a critical-path
    matmul ready at 0.94 s ran at 1.09 s, behind four matmuls the plan put after it).
    Two in flight still overlap one task's input pulls with another's kernel.

    ``eager``: send a placed task ahead of its inputs when they all run on its node
    (state.py's module doc: Early sends). ``free_intermediates``: emit ``Free`` for a done
    task's output once all its readers are done and it is not fetched (module doc:
    Intermediates)."""

    min_timeout_s: float = 0.5
    deadline_factor: float = 10.0
    run_slack_s: float = 5.0
    max_sends: int = 3
    max_attempts: int = 8
    retry_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    small_task_s: float = 1e-4
    small_task_bytes: int = 1 << 16
    small_slots: int = 16
    heavy_task_s: float = 0.01
    heavy_slots: int = 2
    eager: bool = True
    free_intermediates: bool = True

    def is_small(self, spec: TaskSpec) -> bool:
        return spec.cost_s < self.small_task_s and spec.output_bytes <= self.small_task_bytes

    def capacity(self, spec: TaskSpec, slots: int) -> int:
        """How many tasks a node with ``slots`` may run when ``spec`` joins them."""
        if self.is_small(spec):
            return max(slots, self.small_slots)
        if spec.cost_s >= self.heavy_task_s:
            return min(slots, self.heavy_slots)
        return slots

    def resend_timeout(self, spec: TaskSpec) -> float:
        return max(self.min_timeout_s, self.deadline_factor * spec.cost_s)

    def run_budget(self, spec: TaskSpec, overruns: int) -> float:
        return (self.run_slack_s + self.deadline_factor * spec.cost_s) * 2.0 ** min(overruns, 16)
