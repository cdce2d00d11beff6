"""Repository functions for tasks, tiles, events and restart recovery.

Same contract as ``jobs.py``: each function takes an open ``Session``, validates input before
any SQL, raises the errors of ``errors.py``, and leaves rollback to the caller's transaction.
For the dispatcher's hot path use ``BatchWriter`` (``batch.py``), which writes the same
changes in one transaction per batch.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from triplane.metadb import validate as v
from triplane.metadb.errors import ConflictError, InvalidInputError, UnknownJobError, UnknownTaskError
from triplane.metadb.fast import insert_many, json_text
from triplane.metadb.models import Event, Job, Task, Tile
from triplane.metadb.records import (
    EventInfo,
    JobInfo,
    NewEvent,
    NewTask,
    ResumeJob,
    TaskInfo,
    TileInfo,
    TileLocation,
)

TASK_FIELDS = ("attempt", "node", "queued_at", "started_at", "finished_at", "predicted_s",
               "actual_s", "error_kind", "error_message")


_TASK_FIELDS = frozenset(TASK_FIELDS)
_TIMES = frozenset({"queued_at", "started_at", "finished_at", "predicted_s", "actual_s"})


def task_changes(state: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The checked column values of a task transition to ``state`` plus ``fields``.

    Fields not given are left as stored. Unknown field names, bad types and unknown states
    raise InvalidInputError; error messages are clipped to MAX_ERROR_CHARS.
    """
    if not _TASK_FIELDS.issuperset(fields):
        unknown = sorted(set(fields) - _TASK_FIELDS)
        raise InvalidInputError(f"unknown task fields {unknown} (known: {list(TASK_FIELDS)})")
    out: dict[str, Any] = {"state": v.check_state("state", state, v.TASK_STATES)}
    # The dispatcher's journal calls this for every task of every job: the usual values
    # (an int attempt, a short node name, a finite float time) are accepted inline, anything
    # else goes through the full check, which raises or normalises.
    for name, value in fields.items():
        t = type(value)
        if name in _TIMES:
            out[name] = value if t is float and math.isfinite(value) else v.check_time(name, value)
        elif name == "node":
            ok = value is None or (t is str and 0 < len(value) <= v.MAX_ID and "\x00" not in value)
            out[name] = value if ok else v.check_optional_id(name, value)
        elif name == "attempt":
            out[name] = value if t is int and value >= 0 else v.check_count(name, value)
        elif name == "error_kind":
            out[name] = None if value is None else v.check_state(name, value, v.ERROR_KINDS)
        else:  # error_message
            out[name] = v.clip_error(value)
    return out


def require_jobs(session: Session, job_ids: Iterable[str]) -> None:
    """Raise UnknownJobError for the first of ``job_ids`` that does not exist."""
    wanted = {v.check_id("job_id", j) for j in job_ids}
    if not wanted:
        return
    found = set(session.scalars(sa.select(Job.id).where(Job.id.in_(wanted))))
    missing = sorted(wanted - found)
    if missing:
        raise UnknownJobError(missing[0])


def insert_tasks(session: Session, job_id: str, tasks: Iterable[NewTask]) -> int:
    """Insert a job's tasks in one statement and add their number to ``tasks_total``.

    A task id repeated in ``tasks`` or already stored raises ConflictError (nothing inserted).
    """
    require_jobs(session, [job_id])
    rows, seen = task_rows(job_id, tasks)
    if not rows:
        return 0
    # A new job (the usual case) has no tasks yet: one indexed probe instead of a 10^4-id IN.
    has_tasks = session.scalars(sa.select(Task.task_id).where(Task.job_id == job_id).limit(1)).first()
    clash = None if has_tasks is None else session.scalars(sa.select(Task.task_id).where(
        Task.job_id == job_id, Task.task_id.in_(seen)).limit(1)).first()
    if clash is not None:
        raise ConflictError(f"task {clash!r} of job {job_id!r} already exists")
    insert_many(session.connection(), Task.__table__, TASK_COLUMNS, rows)
    session.execute(sa.update(Job).where(Job.id == job_id).values(
        tasks_total=Job.tasks_total + len(rows), updated_at=time.time()))
    return len(rows)


TASK_COLUMNS = ("job_id", "task_id", "op", "state", "attempt", "node", "predicted_s")


def task_rows(job_id: str, tasks: Iterable[NewTask]) -> tuple[list[tuple[Any, ...]], set[str]]:
    """The checked ``TASK_COLUMNS`` values of new tasks, and their ids; ConflictError for
    an id given twice."""
    rows: list[tuple[Any, ...]] = []
    seen: set[str] = set()
    # The checks of validate.py, inlined for the common case (a job of 10^4 tasks is
    # submitted on the request path): the same errors as check_id & co. for anything else.
    states = v.TASK_STATES
    for t in tasks:
        if type(t) is not NewTask and not isinstance(t, NewTask):
            raise InvalidInputError(f"tasks must be NewTask records, got {type(t).__name__}")
        tid, op, node, predicted = t.task_id, t.op, t.node, t.predicted_s
        if not (type(tid) is str and 0 < len(tid) <= v.MAX_ID and "\x00" not in tid):
            v.check_id("task_id", tid)
        if tid in seen:
            raise ConflictError(f"task id {tid!r} appears twice")
        seen.add(tid)
        if not (type(op) is str and 0 < len(op) <= v.MAX_ID and "\x00" not in op):
            v.check_id("op", op)
        if t.state not in states:
            v.check_state("state", t.state, states)
        if node is not None:
            v.check_id("node", node)
        if predicted is not None and not (type(predicted) is float and math.isfinite(predicted)):
            predicted = v.check_time("predicted_s", predicted)
        rows.append((job_id, tid, op, t.state, 0, node, predicted))
    return rows, seen


def get_task(session: Session, job_id: str, task_id: str) -> TaskInfo:
    row = session.get(Task, (v.check_id("job_id", job_id), v.check_id("task_id", task_id)),
                      populate_existing=True)
    if row is None:
        require_jobs(session, [job_id])
        raise UnknownTaskError(job_id, task_id)
    return TaskInfo.of(row)


def list_tasks(session: Session, job_id: str, *, states: Iterable[str] | None = None) -> list[TaskInfo]:
    """A job's tasks by task id; UnknownJobError for an unknown job."""
    require_jobs(session, [job_id])
    q = sa.select(Task).where(Task.job_id == job_id).order_by(Task.task_id)
    if states is not None:
        q = q.where(Task.state.in_([v.check_state("states", s, v.TASK_STATES) for s in states]))
    return [TaskInfo.of(r) for r in session.scalars(q.execution_options(populate_existing=True))]


def task_page(session: Session, job_id: str, *, after: str | None = None,
              limit: int = 50) -> list[TaskInfo]:
    """Up to ``limit`` of a job's tasks by task id, after the id ``after`` -- keyset paging
    on the primary key (job_id, task_id), never an OFFSET scan; UnknownJobError for an
    unknown job."""
    require_jobs(session, [job_id])
    q = sa.select(Task).where(Task.job_id == job_id)
    if after is not None:
        q = q.where(Task.task_id > v.check_id("after", after))
    q = q.order_by(Task.task_id).limit(_page_limit(limit))
    return [TaskInfo.of(r) for r in session.scalars(q.execution_options(populate_existing=True))]


def task_events(session: Session, job_id: str, task_ids: Iterable[str],
                kinds: Iterable[str]) -> list[EventInfo]:
    """The events of ``kinds`` of some tasks of a job, in id order (``ix_events_job_id_task_id``)."""
    ids = [v.check_id("task_id", t) for t in task_ids]
    if not ids:
        return []
    q = sa.select(Event).where(Event.job_id == job_id, Event.task_id.in_(ids),
                               Event.kind.in_(list(kinds))).order_by(Event.id)
    return [EventInfo.of(r) for r in session.scalars(q)]


def tile_page(session: Session, job_id: str, *, after: tuple[str, str] | None = None,
              limit: int = 50) -> list[TileInfo]:
    """Up to ``limit`` of a job's tile rows by (tensor, index), after ``after`` (the
    (tensor, index key) of the previous page's last: keyset paging on the unique key
    (job_id, tensor, index_key)); UnknownJobError for an unknown job."""
    require_jobs(session, [job_id])
    q = sa.select(Tile).where(Tile.job_id == job_id)
    if after is not None:
        tensor, key = v.check_id("after", after[0]), str(after[1])
        q = q.where(Tile.tensor >= tensor, sa.or_(Tile.tensor > tensor, Tile.index_key > key))
    q = q.order_by(Tile.tensor, Tile.index_key).limit(_page_limit(limit))
    return [TileInfo.of(r) for r in session.scalars(q.execution_options(populate_existing=True))]


def index_key(index: Iterable[int]) -> str:
    """A tile index as the unique key stores it (``"0.1"``; ``""`` for a whole tensor)."""
    return ".".join(str(i) for i in index)


def _page_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_001:
        raise InvalidInputError(f"limit must be an int in 1..10001, got {limit!r}")
    return limit


def kernel_times(session: Session, job_id: str) -> dict[str, tuple[float, float]]:
    """task id -> (kernel start, kernel end) of a job's done tasks whose rows hold their
    kernel's times (unix seconds on the executor's clock), i.e. rows with ``actual_s`` set:
    the dispatcher writes it together with them (docs/metadb.md). Rows without it (written
    by an older version, or by hand) are left out. UnknownJobError for an unknown job."""
    require_jobs(session, [job_id])
    q = sa.select(Task.task_id, Task.started_at, Task.finished_at).where(
        Task.job_id == job_id, Task.state == "done", Task.actual_s.is_not(None))
    return {tid: (start, end) for tid, start, end in session.execute(q)
            if start is not None and end is not None}


def transition_task(session: Session, job_id: str, task_id: str, state: str, *,
                    expect: str | None = None, **fields: Any) -> TaskInfo:
    """Move a task to ``state``, setting any of TASK_FIELDS; returns the stored task.

    With ``expect`` the change happens only if the task is in that state (compare-and-set),
    else ConflictError — e.g. a late reply of attempt 0 must not overwrite attempt 1's state.
    Unknown job or task raise UnknownJobError / UnknownTaskError.
    """
    v.check_id("job_id", job_id)
    v.check_id("task_id", task_id)
    values = task_changes(state, fields)
    q = sa.update(Task).where(Task.job_id == job_id, Task.task_id == task_id)
    if expect is not None:
        q = q.where(Task.state == v.check_state("expect", expect, v.TASK_STATES))
    if session.execute(q.values(**values)).rowcount == 0:
        current = get_task(session, job_id, task_id)  # raises if it does not exist
        raise ConflictError(f"task {task_id!r} of job {job_id!r} is {current.state!r}, not {expect!r}")
    return get_task(session, job_id, task_id)


TILE_COLUMNS = ("job_id", "tensor", "index", "index_key", "shape", "dtype", "nbytes", "node", "memory_engine",
                "state", "updated_at")
_TILE_KEY = ("job_id", "tensor", "index_key")
_TILE_UPDATE = ("shape", "dtype", "nbytes", "node", "memory_engine", "state", "updated_at")


def tile_row(job_id: str, t: TileLocation, now: float) -> tuple[Any, ...]:
    """The checked column values of a tile location, in TILE_COLUMNS order (JSON as text)."""
    if type(t) is not TileLocation and not isinstance(t, TileLocation):
        raise InvalidInputError(f"tiles must be TileLocation records, got {type(t).__name__}")
    # A task's output tile is 0-d-indexed (and often 0-d): skip the list checks then.
    index = v.check_ints("index", t.index) if t.index else []
    shape = v.check_ints("shape", t.shape) if t.shape else []
    if t.state not in v.TILE_STATES:
        v.check_state("state", t.state, v.TILE_STATES)
    nbytes = t.nbytes
    if type(nbytes) is not int or nbytes < 0:
        v.check_count("nbytes", nbytes)
    return (job_id, v.check_id("tensor", t.tensor), json_text(index) if index else "[]",
            index_key(index), json_text(shape) if shape else "[]", v.check_id("dtype", t.dtype),
            nbytes, v.check_optional_id("node", t.node),
            v.check_optional_id("memory_engine", t.memory_engine), t.state, now)


def upsert_tiles(conn: sa.Connection, rows: Iterable[tuple[Any, ...]]) -> int:
    """Write ``tile_row`` tuples; the last of several rows for one (job, tensor, index) wins."""
    by_key = {(r[0], r[1], r[3]): r for r in rows}
    insert_many(conn, Tile.__table__, TILE_COLUMNS, list(by_key.values()), conflict=_TILE_KEY,
                update=_TILE_UPDATE)
    return len(by_key)


def record_tiles(session: Session, job_id: str, tiles: Iterable[TileLocation],
                 *, now: float | None = None) -> int:
    """Upsert tile locations of a job by (tensor, index); returns how many were written.

    A tile recorded again (moved, recomputed on another node, freed) replaces its row.
    """
    require_jobs(session, [job_id])
    t = time.time() if now is None else now
    return upsert_tiles(session.connection(), [tile_row(job_id, tile, t) for tile in tiles])


def list_tiles(session: Session, job_id: str, tensor: str) -> list[TileInfo]:
    """The tiles of one tensor of a job, in index order; UnknownJobError for an unknown job."""
    require_jobs(session, [job_id])
    rows = session.scalars(sa.select(Tile).where(
        Tile.job_id == job_id, Tile.tensor == v.check_id("tensor", tensor)
    ).execution_options(populate_existing=True))
    return sorted((TileInfo.of(r) for r in rows), key=lambda t: t.index)


def mark_node_tiles_lost(session: Session, node: str, *, now: float | None = None) -> int:
    """Mark every present tile on ``node`` as lost (its node died); returns how many."""
    result = session.execute(sa.update(Tile).where(
        Tile.node == v.check_id("node", node), Tile.state == "present",
    ).values(state="lost", updated_at=time.time() if now is None else now))
    return int(result.rowcount)


def event_row(e: NewEvent, now: float) -> dict[str, Any]:
    """The checked column values of an event; PayloadTooLargeError past MAX_PAYLOAD_BYTES."""
    if not isinstance(e, NewEvent):
        raise InvalidInputError(f"events must be NewEvent records, got {type(e).__name__}")
    v.json_size("event payload", e.payload, v.MAX_PAYLOAD_BYTES)
    at = v.check_time("at", e.at)
    if e.seq is not None:
        v.check_count("seq", e.seq)
    return {"job_id": v.check_optional_id("job_id", e.job_id),
            "task_id": v.check_optional_id("task_id", e.task_id),
            "kind": _kind(e.kind),
            "stimulus_id": v.check_optional_id("stimulus_id", e.stimulus_id),
            "at": now if at is None else at, "payload": e.payload, "seq": e.seq,
            "node": v.check_optional_id("node", e.node)}


def _kind(kind: object) -> str:
    v.check_id("kind", kind)
    assert isinstance(kind, str)
    if len(kind) > 64:
        raise InvalidInputError(f"event kind is {len(kind)} characters long (at most 64)")
    return kind


def add_events(session: Session, events: Iterable[NewEvent], *, now: float | None = None) -> int:
    """Append events in one statement; UnknownJobError if any names an unknown job."""
    t = time.time() if now is None else now
    rows = [event_row(e, t) for e in events]
    if not rows:
        return 0
    conn = session.connection()
    wanted = {r["job_id"] for r in rows if r["job_id"] is not None}
    if len(wanted) > 64:
        require_jobs(session, wanted)
    elif wanted:  # the usual case (a job's event on the request path): one driver-level probe
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        found = {r[0] for r in conn.exec_driver_sql(
            f"SELECT id FROM jobs WHERE id IN ({', '.join([mark] * len(wanted))})", tuple(wanted))}
        if found != wanted:
            raise UnknownJobError(min(wanted - found))
    insert_event_rows(conn, rows)
    return len(rows)


EVENT_COLUMNS = ("job_id", "task_id", "kind", "stimulus_id", "at", "payload", "seq", "node")


def insert_event_rows(conn: sa.Connection, rows: Iterable[dict[str, Any]]) -> None:
    """INSERT checked event rows (``event_row``'s), their jobs known to exist."""
    insert_many(conn, Event.__table__, EVENT_COLUMNS, [tuple(
        json_text(r[c]) if c == "payload" else r[c] for c in EVENT_COLUMNS) for r in rows])


def list_events(session: Session, job_id: str, *, task_id: str | None = None, after_id: int = 0,
                limit: int = 1000, kind: str | None = None) -> list[EventInfo]:
    """A job's events in the order they were written (by id), those with id > ``after_id``
    (and of ``kind``, if given), at most ``limit`` — page with ``after_id=last.id``."""
    require_jobs(session, [job_id])
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise InvalidInputError(f"limit must be an int in 1..100000, got {limit!r}")
    q = sa.select(Event).where(Event.job_id == job_id, Event.id > v.check_count("after_id", after_id))
    if task_id is not None:
        q = q.where(Event.task_id == v.check_id("task_id", task_id))
    if kind is not None:
        q = q.where(Event.kind == _kind(kind))
    return [EventInfo.of(r) for r in session.scalars(q.order_by(Event.id).limit(limit))]


def jobs_to_resume(session: Session) -> list[ResumeJob]:
    """Every job not in a terminal state, oldest first, with all of its tasks (by task id).

    A restarted scheduler calls this once: tasks "dispatched" may or may not have
    finished on their executor, so it re-dispatches them (results are deduplicated by task id).
    """
    jobs = list(session.scalars(sa.select(Job).where(
        Job.state.not_in(sorted(v.TERMINAL_JOB_STATES))).order_by(Job.created_at, Job.id)))
    if not jobs:
        return []
    tasks: dict[str, list[TaskInfo]] = defaultdict(list)
    ids = [j.id for j in jobs]
    for chunk in range(0, len(ids), 500):  # bound the IN list (SQLite caps bound parameters)
        q = sa.select(Task).where(Task.job_id.in_(ids[chunk:chunk + 500])).order_by(Task.job_id, Task.task_id)
        for row in session.scalars(q):
            tasks[row.job_id].append(TaskInfo.of(row))
    return [ResumeJob(JobInfo.of(j), tuple(tasks[j.id])) for j in jobs]
