"""The states of a task and of a job: one vocabulary for the dispatcher, the metadb and the API.

Both are ``str`` enums, so a member *is* its value: it compares equal to the plain string
(``TaskState.DONE == "done"``), serialises as that string (JSON, YAML, SQL) and prints as
it. Stored rows and API bodies hold the values below; nothing else spells a state.

Task states (the dispatcher's transitions between them: ``docs/scheduler.md``)::

    pending     waiting for an input (not yet computed, or lost with its node)
    ready       every input is available: waiting for a node with a free slot
    dispatched  sent to a node; waiting for its reply
    done        its output is stored on the node that ran it        (terminal*)
    failed      a user error, or out of attempts                    (terminal)
    cancelled   its job failed or was cancelled                     (terminal)

    * a done task becomes pending/ready again when its output is lost and still needed.

Job states (as the API shows them)::

    queued      accepted, not dispatched yet (being compiled or stored)
    running     its tasks are being dispatched
    done / failed / cancelled   terminal
"""

from __future__ import annotations

from enum import Enum

__all__ = ["TERMINAL_JOB_STATES", "TERMINAL_TASK_STATES", "JobState", "TaskState"]


class TaskState(str, Enum):
    PENDING = "pending"
    READY = "ready"
    DISPATCHED = "dispatched"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


class JobState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


TERMINAL_TASK_STATES: frozenset[TaskState] = frozenset(
    {TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED})
TERMINAL_JOB_STATES: frozenset[JobState] = frozenset(
    {JobState.DONE, JobState.FAILED, JobState.CANCELLED})
