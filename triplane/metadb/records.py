"""The plain, frozen values the repository functions take and return.

Callers never hold ORM objects: a record is a snapshot, safe to pass between threads and to
keep after its transaction ends. Inputs (``NewTask``, ``TileLocation``, ``NewEvent``) are
checked by the function that writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triplane.metadb import models as m


@dataclass(frozen=True)
class GraphInfo:
    hash: str
    canonical: bytes
    node_count: int
    created_at: float

    @classmethod
    def of(cls, row: m.Graph) -> GraphInfo:
        return cls(row.hash, bytes(row.canonical), row.node_count, row.created_at)


@dataclass(frozen=True)
class PlanInfo:
    id: str
    graph_hash: str
    structure_hash: str
    plan: Any
    predicted_makespan: float | None
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, row: m.Plan) -> PlanInfo:
        return cls(row.id, row.graph_hash, row.structure_hash, row.plan, row.predicted_makespan,
                   row.created_at, row.updated_at)


@dataclass(frozen=True)
class JobInfo:
    id: str
    state: str
    graph_hash: str
    plan_id: str | None
    fetch: tuple[str, ...]
    error: str | None
    owner: str | None
    tasks_total: int
    tasks_done: int
    tasks_failed: int
    created_at: float
    updated_at: float
    name: str | None = None
    tags: tuple[str, ...] = ()

    @classmethod
    def of(cls, row: m.Job) -> JobInfo:
        return cls(row.id, row.state, row.graph_hash, row.plan_id, tuple(row.fetch), row.error,
                   row.owner, row.tasks_total, row.tasks_done, row.tasks_failed, row.created_at,
                   row.updated_at, row.name, tuple(row.tags or ()))


@dataclass(frozen=True)
class NewTask:
    """A task to insert; ``state`` is usually "pending" (inputs not ready) or "ready"."""

    task_id: str
    op: str
    state: str = "pending"
    predicted_s: float | None = None
    node: str | None = None


@dataclass(frozen=True)
class TaskInfo:
    job_id: str
    task_id: str
    op: str
    state: str
    attempt: int
    node: str | None
    queued_at: float | None
    started_at: float | None
    finished_at: float | None
    predicted_s: float | None
    actual_s: float | None
    error_kind: str | None
    error_message: str | None

    @classmethod
    def of(cls, row: m.Task) -> TaskInfo:
        return cls(row.job_id, row.task_id, row.op, row.state, row.attempt, row.node, row.queued_at,
                   row.started_at, row.finished_at, row.predicted_s, row.actual_s, row.error_kind,
                   row.error_message)


@dataclass(frozen=True)
class TileLocation:
    """Where a tile is (or will be): upserted by (job, tensor, index)."""

    tensor: str
    index: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    node: str | None = None
    memory_engine: str | None = None
    state: str = "present"


@dataclass(frozen=True)
class TileInfo:
    job_id: str
    tensor: str
    index: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    node: str | None
    memory_engine: str | None
    state: str
    updated_at: float

    @classmethod
    def of(cls, row: m.Tile) -> TileInfo:
        return cls(row.job_id, row.tensor, tuple(row.index), tuple(row.shape), row.dtype, row.nbytes,
                   row.node, row.memory_engine, row.state, row.updated_at)


@dataclass(frozen=True)
class NewEvent:
    """An event to append. ``at`` defaults to the time it is written."""

    job_id: str
    kind: str
    task_id: str | None = None
    stimulus_id: str | None = None
    at: float | None = None
    payload: Any = field(default_factory=dict)


@dataclass(frozen=True)
class EventInfo:
    id: int
    job_id: str
    task_id: str | None
    kind: str
    stimulus_id: str | None
    at: float
    payload: Any

    @classmethod
    def of(cls, row: m.Event) -> EventInfo:
        return cls(row.id, row.job_id, row.task_id, row.kind, row.stimulus_id, row.at, row.payload)


@dataclass(frozen=True)
class ResumeJob:
    """A job that was not finished when the scheduler stopped, with all of its tasks."""

    job: JobInfo
    tasks: tuple[TaskInfo, ...]
