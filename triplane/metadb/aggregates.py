"""Aggregates of a job's task rows and of every tile row, for the dashboard (docs/dashboard.md):
one grouped read each, so a 100,000-task job costs one range scan of its rows, never a
page-by-page walk on the client.

* :func:`task_bounds`: when a job's kernels ran (first start, last end) and how many rows say.
* :func:`timeline_buckets`: per node and time bucket, the tasks whose kernel started in it,
  their busy and predicted seconds, failures and retried attempts.
* :func:`tasks_in_window`: the task rows whose kernel overlaps a window (the zoomed-in view).
* :func:`tile_totals`: tiles and bytes per (node, memory engine, state) over every job.

Times are the rows' (unix seconds on the executors' clocks: docs/metadb.md). UnknownJobError
for an unknown job; InvalidInputError for a malformed argument.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from triplane.metadb.errors import InvalidInputError
from triplane.metadb.models import Task, Tile
from triplane.metadb.records import TaskInfo
from triplane.metadb.tasks import require_jobs

__all__ = ["task_bounds", "tasks_in_window", "tile_totals", "timeline_buckets"]

MAX_BUCKETS = 100_000  # the API asks for at most 2,000; the scheduler's histogram for more


def task_bounds(session: Session, job_id: str) -> tuple[float | None, float | None, int]:
    """(the earliest kernel start, the latest kernel end, the rows with a start)."""
    require_jobs(session, [job_id])
    row = session.execute(sa.select(sa.func.min(Task.started_at), sa.func.max(Task.finished_at),
                                    sa.func.count()).where(Task.job_id == job_id,
                                                           Task.started_at.is_not(None))).one()
    return row[0], row[1], int(row[2])


def _bucket_expr(session: Session, t0: float, width: float) -> Any:
    x = (Task.started_at - t0) / width
    # CAST truncates in SQLite and rounds in PostgreSQL: floor there (x >= 0 here)
    return sa.cast(x if session.bind is not None and session.bind.dialect.name == "sqlite"
                   else sa.func.floor(x), sa.Integer)


def timeline_buckets(session: Session, job_id: str, t0: float, t1: float,
                     buckets: int) -> list[dict[str, Any]]:
    """Per (node, bucket) of ``[t0, t1)`` cut in ``buckets`` equal parts, the tasks whose
    kernel started there: ``{"node", "bucket", "tasks", "busy_s", "predicted_s", "failed",
    "retried"}`` (``retried``: attempts after the first). Rows without a start are left out."""
    if not (isinstance(buckets, int) and 1 <= buckets <= MAX_BUCKETS):
        raise InvalidInputError(f"buckets must be in 1..{MAX_BUCKETS}, got {buckets!r}")
    if not t1 > t0:
        raise InvalidInputError(f"the window's end ({t1}) must be after its start ({t0})")
    require_jobs(session, [job_id])
    b = _bucket_expr(session, t0, (t1 - t0) / buckets).label("b")
    busy = sa.func.sum(sa.func.coalesce(Task.finished_at - Task.started_at, 0.0))
    q = (sa.select(Task.node, b, sa.func.count(), busy, sa.func.sum(sa.func.coalesce(Task.predicted_s, 0.0)),
                   sa.func.sum(sa.case((Task.state == "failed", 1), else_=0)),
                   sa.func.sum(sa.case((Task.attempt > 1, Task.attempt - 1), else_=0)))
         .where(Task.job_id == job_id, Task.started_at >= t0, Task.started_at < t1)
         .group_by(Task.node, b))
    return [{"node": r[0], "bucket": min(int(r[1]), buckets - 1), "tasks": int(r[2]),
             "busy_s": float(r[3] or 0), "predicted_s": float(r[4] or 0),
             "failed": int(r[5] or 0), "retried": int(r[6] or 0)}
            for r in session.execute(q)]


def tasks_in_window(session: Session, job_id: str, t0: float, t1: float, limit: int) -> list[TaskInfo]:
    """Up to ``limit`` task rows whose kernel overlaps ``[t0, t1)``, by start."""
    if not (isinstance(limit, int) and 1 <= limit <= 10_001):
        raise InvalidInputError(f"limit must be in 1..10001, got {limit!r}")
    require_jobs(session, [job_id])
    q = (sa.select(Task).where(Task.job_id == job_id, Task.started_at < t1,
                               sa.func.coalesce(Task.finished_at, Task.started_at) >= t0)
         .order_by(Task.started_at, Task.task_id).limit(limit))
    return [TaskInfo.of(r) for r in session.scalars(q)]


def tile_totals(session: Session) -> list[dict[str, Any]]:
    """Tiles and bytes per (node, memory engine, state), over every job the metadb holds."""
    q = (sa.select(Tile.node, Tile.memory_engine, Tile.state, sa.func.count(), sa.func.sum(Tile.nbytes))
         .group_by(Tile.node, Tile.memory_engine, Tile.state)
         .order_by(Tile.node, Tile.memory_engine, Tile.state))
    return [{"node": r[0], "memory_engine": r[1], "state": r[2], "tiles": int(r[3]), "bytes": int(r[4] or 0)}
            for r in session.execute(q)]
