"""Batched writes for the dispatcher's hot path: task transitions, tile locations, events,
job progress.

A job of thousands of tasks makes several writes per task (ready, dispatched, done,
each with an event). One commit each would cap the scheduler at the database's commit rate
(a few hundred per second on a disk-backed SQLite). ``BatchWriter`` queues them and a
background thread writes them in one transaction per batch: when ``max_items`` are queued or
the oldest has waited ``max_delay`` seconds, whichever comes first.

Contract:
- ``transition``/``transitions``/``tiles``/``event``/``job_progress`` validate at once
  (raising the errors of ``errors.py``: unknown job or task, bad state, oversized payload)
  and never block on the database; a queued item is therefore always writable.
- Items are written in the order queued; transitions of the same task in one batch collapse
  to their last values (the same result as applying them one by one).
- ``flush()`` returns once everything queued before it is committed. If the database fails,
  the batch stays queued (retried by the next flush) and ``flush()`` raises BatchWriteError.
- At most ``max_pending`` items wait; past that (the database is down or too slow) the
  queueing call raises BatchWriteError instead of growing memory without bound.
- ``close()`` flushes and stops the thread; queueing afterwards raises BatchWriteError.
- ``new_job`` queues a whole new job (``jobs.job_rows``, checked when built), inserted in
  its batch's transaction before that batch's updates. A batch that fails on a conflict
  (a job id in use, a graph hash stored with other bytes: a broken id generator or a hash
  collision) is not retried: it is logged and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from triplane.metadb import validate as v
from triplane.metadb.db import MetaDB
from triplane.metadb.errors import BatchWriteError, ConflictError, UnknownJobError, UnknownTaskError
from triplane.metadb.fast import update_many
from triplane.metadb.jobs import JobRows, write_job_rows
from triplane.metadb.models import Event, Job, Task
from triplane.metadb.records import NewEvent, TileLocation
from triplane.metadb.tasks import event_row, task_changes, tile_row, upsert_tiles

log = logging.getLogger(__name__)

_TASK = 0
_EVENT = 1
_JOB = 2
_TILE = 3
_NEW_JOB = 4
KNOWN_JOBS = 4096  # jobs whose ids the writer takes as stored without a query (a bounded cache)
KNOWN_GRAPHS = 64  # graphs whose rows new_job knows are stored (retention deletes a graph
# with its last job: ``forget`` clears them)


@dataclass
class BatchStats:
    """What a BatchWriter has done so far (read without a lock: values are approximate)."""

    commits: int = 0
    items: int = 0
    failures: int = 0
    last_error: str | None = None


class BatchWriter:
    """Queues hot-path writes and commits them in batches (see the module docstring)."""

    def __init__(self, db: MetaDB, *, max_items: int = 500, max_delay: float = 0.05,
                 max_pending: int = 200_000, retry_delay: float = 0.5) -> None:
        if max_items < 1 or max_delay <= 0 or max_pending < max_items:
            raise ValueError("need max_items >= 1, max_delay > 0 and max_pending >= max_items")
        self._db = db
        self._reader = db.engine.execution_options(triplane_readonly=True)
        self.max_items = max_items
        self.max_delay = max_delay
        self.max_pending = max_pending
        self.retry_delay = retry_delay
        self.stats = BatchStats()
        self._pending: list[tuple[int, Any, Any]] = []
        self._first_at = 0.0
        self._cond = threading.Condition()
        self._flush_lock = threading.Lock()  # one batch in flight at a time keeps the order
        self._closed = False
        # The ids taken as stored, the last KNOWN_JOBS jobs' (oldest first; an id evicted
        # costs one checking query at its next write, as an unknown one does)
        self._known_jobs: dict[str, None] = {}
        self._known_tasks: dict[str, set[str]] = {}
        self._known_lock = threading.Lock()  # jobs are taken as stored from worker threads too
        self._graphs: dict[str, bytes] = {}  # graph hash -> bytes committed by a new_job (the latest)
        self._new: set[str] = set()  # new jobs queued, not committed yet
        self._thread = threading.Thread(target=self._run, name="metadb-batch-writer", daemon=True)
        self._thread.start()

    # -- queueing (callers' threads) ---------------------------------------------------------

    def transition(self, job_id: str, task_id: str, state: str, **fields: Any) -> None:
        """Queue a task transition (``fields`` as ``tasks.transition_task``)."""
        values = task_changes(state, fields)
        self._check_task(job_id, task_id)
        self._put(_TASK, (job_id, task_id), values)

    def transitions(self, job_id: str, changes: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Queue many transitions of one job: (task id, state, fields) each, checked like
        ``transition``; all or none are queued (one lock for the lot: the dispatcher's
        journal hands over thousands at a time)."""
        items = []
        for task_id, state, fields in changes:
            values = task_changes(state, fields)
            self._check_task(job_id, task_id)
            items.append((_TASK, (job_id, task_id), values))
        self._put_many(items)

    def tiles(self, job_id: str, locations: list[TileLocation]) -> None:
        """Queue tile locations of a job (upserted by tensor and index, as ``record_tiles``)."""
        now = time.time()
        rows = [tile_row(job_id, t, now) for t in locations]
        self._check_job(job_id)
        self._put_many([(_TILE, None, r) for r in rows])

    def event(self, job_id: str | None, kind: str, *, task_id: str | None = None,
              stimulus_id: str | None = None, at: float | None = None, payload: Any = None,
              seq: int | None = None, node: str | None = None) -> None:
        """Queue an event (``NewEvent``'s fields); ``at`` defaults to now (the time it was
        queued, not written)."""
        row = event_row(NewEvent(job_id=job_id, kind=kind, task_id=task_id, stimulus_id=stimulus_id,
                                 at=at, payload={} if payload is None else payload, seq=seq, node=node),
                        time.time())
        if job_id is not None:
            self._check_job(job_id)
        self._put(_EVENT, None, row)

    def job_progress(self, job_id: str, *, state: str | None = None, tasks_done: int | None = None,
                     tasks_failed: int | None = None, error: str | None = None) -> None:
        """Queue a job's state and/or progress counters (the last values queued win)."""
        values: dict[str, Any] = {"updated_at": time.time()}
        if state is not None:
            values["state"] = v.check_state("state", state, v.JOB_STATES)
        if tasks_done is not None:
            values["tasks_done"] = v.check_count("tasks_done", tasks_done)
        if tasks_failed is not None:
            values["tasks_failed"] = v.check_count("tasks_failed", tasks_failed)
        if error is not None:
            values["error"] = v.clip_error(error)
        self._check_job(job_id)
        self._put(_JOB, job_id, values)

    def new_job(self, rows: JobRows) -> None:
        """Queue a new job's rows (``jobs.job_rows``): written before the updates of its
        batch, in order with the other new jobs; its later writes need no check."""
        self._new.add(rows.job_id)
        self._put_many([(_NEW_JOB, rows.job_id, rows)])
        self.known(rows.job_id, (t[1] for t in rows.tasks))

    def inserting(self, job_id: str) -> bool:
        """Is ``job_id`` a new job whose rows are queued, not committed yet?"""
        return job_id in self._new

    def _put(self, kind: int, key: Any, values: Any) -> None:
        self._put_many([(kind, key, values)])

    def _put_many(self, items: list[tuple[int, Any, Any]]) -> None:
        if not items:
            return
        with self._cond:
            if self._closed:
                raise BatchWriteError("the batch writer is closed")
            if len(self._pending) + len(items) > self.max_pending:
                raise BatchWriteError(
                    f"{len(self._pending)} writes are waiting for the database (limit "
                    f"{self.max_pending}); last error: {self.stats.last_error}")
            was = len(self._pending)
            if not was:
                self._first_at = time.monotonic()
            self._pending.extend(items)
            if was == 0 or len(self._pending) >= self.max_items:
                self._cond.notify()

    def forget(self, job_ids: Iterable[str]) -> None:
        """Drop the cached ids of jobs whose rows were deleted (retention): a later write
        naming one is refused as unknown instead of failing its batch; and the graphs taken
        as stored."""
        with self._known_lock:
            for job_id in job_ids:
                self._known_jobs.pop(job_id, None)
                self._known_tasks.pop(job_id, None)
        self._graphs.clear()  # their graphs may have gone with them (a batch failing on one retries)

    def known(self, job_id: str, task_ids: Iterable[str]) -> None:
        """Take a job's rows as stored (its submitter has just committed them): its writes
        are then queued without the queries that check them (a compiled training step is a
        new job each time: two queries on the scheduler's loop per step otherwise)."""
        self._know(job_id)
        self._known_tasks.setdefault(job_id, set()).update(task_ids)

    def _know(self, job_id: str) -> None:
        with self._known_lock:
            self._known_jobs[job_id] = None
            while len(self._known_jobs) > KNOWN_JOBS:
                old = next(iter(self._known_jobs))
                del self._known_jobs[old]
                self._known_tasks.pop(old, None)

    def knows(self, job_id: str) -> bool:
        """Is ``job_id``'s row taken as stored (a write naming it costs no query)?"""
        return job_id in self._known_jobs

    # Known ids are cached so that validation costs one query per job, not one per item.
    def _check_job(self, job_id: str) -> None:
        if job_id in self._known_jobs:
            return
        v.check_id("job_id", job_id)
        with self._reader.connect() as conn:
            if conn.scalar(sa.select(Job.id).where(Job.id == job_id)) is None:
                raise UnknownJobError(job_id)
        self._know(job_id)

    def _check_task(self, job_id: str, task_id: str) -> None:
        known = self._known_tasks.get(job_id)
        if known is not None and task_id in known:
            return
        self._check_job(job_id)
        v.check_id("task_id", task_id)
        with self._reader.connect() as conn:  # reload: tasks may have been inserted since
            known = set(conn.scalars(sa.select(Task.task_id).where(Task.job_id == job_id)))
        self._known_tasks[job_id] = known
        if task_id not in known:
            raise UnknownTaskError(job_id, task_id)

    # -- writing (the background thread, or flush()'s caller) ---------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return  # close() does the final flush on its own thread
                deadline = self._first_at + self.max_delay
                while len(self._pending) < self.max_items and not self._closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            try:
                self._drain()
            except BatchWriteError:
                # Already counted and logged; back off so a dead database is not hammered.
                time.sleep(self.retry_delay)

    def _drain(self) -> int:
        """Write batches until nothing is queued; returns the number of items written."""
        written = 0
        with self._flush_lock:
            while True:
                with self._cond:
                    batch = self._pending[: self.max_items]
                    del self._pending[: self.max_items]
                    if self._pending:
                        self._first_at = time.monotonic()
                if not batch:
                    return written
                try:
                    self._write(batch)
                except ConflictError as exc:  # not retried: the same rows would conflict again
                    self._new.difference_update(k for kind, k, _ in batch if kind == _NEW_JOB)
                    self.stats.failures += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    log.error("metadb batch of %d writes dropped: %s", len(batch), exc)
                    raise BatchWriteError(f"a batch of {len(batch)} writes was dropped: {exc}") from exc
                except Exception as exc:
                    with self._cond:
                        self._pending[:0] = batch  # keep it, in order, for the next attempt
                    self.stats.failures += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("metadb batch of %d writes failed (kept for retry): %s", len(batch), exc)
                    raise BatchWriteError(f"writing a batch of {len(batch)} failed: {exc}") from exc
                self.stats.commits += 1
                self.stats.items += len(batch)
                written += len(batch)

    def _write(self, batch: list[tuple[int, Any, Any]]) -> None:
        tasks: dict[tuple[str, str], dict[str, Any]] = {}
        jobs: dict[str, dict[str, Any]] = {}
        events: list[dict[str, Any]] = []
        tiles: list[tuple[Any, ...]] = []
        new_jobs: list[JobRows] = []
        for kind, key, values in batch:
            if kind == _NEW_JOB:
                new_jobs.append(values)
            elif kind == _TASK:
                known = tasks.get(key)
                if known is None:
                    tasks[key] = values
                else:
                    tasks[key] = {**known, **values}
            elif kind == _TILE:
                tiles.append(values)
            elif kind == _JOB:
                jobs.setdefault(key, {}).update(values)
            else:
                events.append(values)
        graphs = self._graphs
        with self._db.engine.begin() as conn:
            for rows in new_jobs:  # queued before any write that names them
                write_job_rows(conn, rows, graph_stored=graphs.get(rows.graph[0]) == rows.graph[1])
            # Driver-level executemany (fast.py): one statement per set of columns changed.
            groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = defaultdict(list)
            for (job_id, task_id), vals in tasks.items():
                cols = tuple(sorted(vals))
                groups[cols].append((*(vals[c] for c in cols), job_id, task_id))
            for cols, values in groups.items():
                update_many(conn, Task.__table__, cols, ("job_id", "task_id"), values)
            if tiles:
                upsert_tiles(conn, tiles)
            for cols, rows in _by_columns({"_job": k, **vals} for k, vals in jobs.items()).items():
                conn.execute(sa.update(Job).where(Job.id == sa.bindparam("_job"))
                             .values({c: sa.bindparam(c) for c in cols}), rows)
            if events:
                conn.execute(sa.insert(Event.__table__), events)
        for rows in new_jobs:  # committed: a training loop's next steps skip their graph's row
            self._new.discard(rows.job_id)
            graphs[rows.graph[0]] = rows.graph[1]
            while len(graphs) > KNOWN_GRAPHS:
                del graphs[next(iter(graphs))]

    def flush(self) -> int:
        """Commit everything queued so far; returns the number of items this call wrote.
        Raises BatchWriteError (items kept queued) if the database refuses."""
        return self._drain()

    def close(self) -> None:
        """Flush, then stop. Raises BatchWriteError if the final flush fails; the writer is
        closed either way (its unwritten items are lost, and the error says how many)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        try:
            self._drain()
        except BatchWriteError as exc:
            raise BatchWriteError(f"closed with {len(self._pending)} writes unwritten: {exc}") from exc

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _by_columns(rows: Any) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Rows grouped by the columns they set: one executemany statement per group."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[tuple(sorted(k for k in row if not k.startswith("_")))].append(row)
    return groups
