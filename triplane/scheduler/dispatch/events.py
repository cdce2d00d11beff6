"""What goes into the dispatcher's state machine (events) and what comes out (instructions).

All frozen dataclasses; time is a field of each event (``now``, unix seconds), never read
from a clock. Every event carries a ``stimulus_id`` that the transitions it causes repeat,
so the event log says why each task moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from triplane.proto.states import TaskState

__all__ = [
    "CancelJob", "Event", "FailureKind", "Free", "Instruction", "JobFinished", "NodeDown", "NodeUp",
    "Send", "SubmitJob", "TaskAcked", "TaskErred", "TaskFailure", "TaskSpec", "TaskSucceeded",
    "Tick", "Transitioned",
]

# user: the kernel rejected its data (or the task cannot be encoded) -- not retried.
# infra: nodes failed it until it ran out of attempts. deadline: the job's deadline passed.
FailureKind = Literal["user", "infra", "deadline"]


@dataclass(frozen=True)
class TaskSpec:
    id: str
    op: str
    deps: tuple[str, ...] = ()
    cost_s: float = 0.001          # predicted run time, for the deadlines
    output_bytes: int = 0
    is_output: bool = False        # fetched by the user: keep (and recompute if lost)
    node: str | None = None        # the node placement chose (followed while alive, not excluded)
    priority: float = 0.0          # lower goes first within a job: the plan's predicted start


@dataclass(frozen=True)
class TaskFailure:
    """Why a task, and so its job, failed -- as data, end to end (executor reply ->
    dispatcher -> the job's API error). ``node`` is the executor the failing attempt ran
    on (or, for a failed pull, the node the input was to come from); ``input`` the input
    tile that could not be pulled. ``task``/``op`` are None for a job-level failure (its
    deadline). For a grouped task (op ``graph``), ``task`` is the plan node inside it whose
    kernel failed, when the executor said which."""

    kind: FailureKind
    message: str
    task: str | None = None
    op: str | None = None
    node: str | None = None
    input: str | None = None
    attempts: int = 0


# --- events (stimuli) -------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    stimulus_id: str


@dataclass(frozen=True)
class SubmitJob(Event):
    """A new job. ``done`` lists (task, node) pairs already computed whose output is held by
    a live node (a restarted scheduler resuming a job): they start done, not pending.
    ``deadline`` (unix seconds, optional): the job fails with kind ``deadline`` if it has
    not ended by then."""

    job: str
    tasks: tuple[TaskSpec, ...]
    now: float
    done: tuple[tuple[str, str], ...] = ()
    deadline: float | None = None
    persist: str | None = None  # its tiles are kept by the persistence target of this kind
    # (task, first attempt) of tasks run again after their job had ended (lineage.py): a
    # new attempt number, so that no executor answers the run from its replay memory
    attempts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class TaskSucceeded(Event):
    job: str
    task: str
    attempt: int
    node: str
    now: float


@dataclass(frozen=True)
class TaskErred(Event):
    """A failure reply. ``input``/``input_node``: the input tile the executor could not
    pull, and the node it was to pull it from (the reply's structured error); ``at``: the
    node of a grouped task's sub-graph whose kernel failed."""

    job: str
    task: str
    attempt: int
    node: str
    kind: Literal["user", "infra"]
    message: str
    now: float
    input: str | None = None
    input_node: str | None = None
    at: str | None = None


@dataclass(frozen=True)
class TaskAcked(Event):
    """The executor has the attempt (a first ack, or its answer to a retransmission while
    the attempt is still there): stop retransmitting until the attempt's resend timeout
    has passed again. ``since``: when its kernel started on the executor, if it has (the
    executor's progress report). Neither extends the attempt's run deadline
    (docs/scheduler.md, "Deadlines"); a first ``since`` moves it to start + budget once."""

    job: str
    task: str
    attempt: int
    now: float
    since: float | None = None


@dataclass(frozen=True)
class Tick(Event):
    """Time passes: deadlines are checked."""

    now: float


@dataclass(frozen=True)
class NodeUp(Event):
    node: str
    slots: int
    now: float


@dataclass(frozen=True)
class NodeDown(Event):
    node: str
    now: float


@dataclass(frozen=True)
class CancelJob(Event):
    job: str
    now: float


# --- instructions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Send (or resend: same attempt) the task's packet to ``node``. ``deadline``: the
    attempt's run deadline (the packet's ``deadline`` field)."""

    job: str
    task: str
    attempt: int
    node: str
    deadline: float
    pull_from: tuple[tuple[str, str], ...]  # (input task id, node holding it)
    resend: bool = False


@dataclass(frozen=True)
class JobFinished:
    job: str
    state: Literal["done", "failed", "cancelled"]
    error: TaskFailure | None = None


@dataclass(frozen=True)
class Free:
    """Delete the output tile of done task ``task`` on ``node``: every task that reads it
    is done and the user does not fetch it (an intermediate). If a reader must run again
    later (its own output lost), the state machine recomputes the tile from lineage."""

    job: str
    task: str
    node: str


@dataclass(frozen=True)
class Transitioned:
    """For the event log and metadb (persisted in batches by the shell)."""

    job: str
    task: str
    start: TaskState
    finish: TaskState
    attempt: int
    node: str | None
    stimulus_id: str
    at: float


Instruction = Send | JobFinished | Transitioned | Free
