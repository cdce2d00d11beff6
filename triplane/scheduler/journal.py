"""Batched persistence of the dispatcher's state: task transitions, events, tiles.

The hot path only fills dicts on the event loop (``transitions``, ``output``); every
``period_s`` the journal hands the *latest* transition of each task to the metadb
``BatchWriter`` (so a task that went ready -> dispatched -> done in between costs one
row update), and queues the output tile locations beside them (written in the same
batches, one transaction each). A database error is logged and the next period tries
again; nothing here blocks the event loop.

Events: the journal publishes the unusual task transitions (``task.failed``,
``task.drifted``, ``task.recomputed``: the normal path is in the tasks table already), a
job's end and its ``job.progress`` (at most every ``period_s``, rate-limited by the bus)
on the scheduler's ``EventBus`` (``events.py``), and writes every event the bus publishes
as an events row (``record``; a held job's wait for its rows like its transitions).

A done task's row gets its kernel's own times from the executor's reply (``started_at``
/ ``finished_at``: kernel start and end, unix seconds on the executor's clock;
``actual_s``: end - start), written with the done transition itself: no extra row
update. A row's ``actual_s`` is what says its times are the kernel's (docs/metadb.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from triplane import metadb as mdb
from triplane.metadb.validate import ERROR_KINDS
from triplane.proto.packet import Reply, Timings
from triplane.scheduler.dispatch.state import DispatchState, Transitioned
from triplane.scheduler.events import Event, EventBus

PERSISTED_READ = "tile.persisted_read"  # an event: a done task's holder died, its tile is read from
# the persistence target named by the row's node (store:<kind>) instead of being computed again

log = logging.getLogger(__name__)

FAILED = "job.failed"  # the event holding a failed job's error body
WRITTEN_WAIT_S = 1.0  # how long a read waits for the journal's writes (Journal.written)

TASK_STATE = {
    "pending": "pending",
    "ready": "ready",
    "dispatched": "dispatched",
    "done": "done",
    "failed": "failed",
    "cancelled": "cancelled",
}


# an unusual transition (start, finish) -> its event's kind
TASK_EVENTS = {
    ("dispatched", "ready"): "task.drifted", ("dispatched", "pending"): "task.drifted",
    ("done", "ready"): "task.recomputed", ("done", "pending"): "task.recomputed",
    ("dispatched", "failed"): "task.failed", ("done", "failed"): "task.failed",
}
END_EVENTS = {"done": "job.done", "failed": "job.failed", "cancelled": "job.cancelled"}


class Journal:
    """Collects what the metadb must learn; ``flush`` queues it to the BatchWriter.
    ``progress(job)`` gives (running?, tasks done, tasks in all) for the job counters.
    ``events``: the bus it publishes on and persists (a private one when not given)."""

    def __init__(self, db: mdb.MetaDB, progress: Callable[[str], tuple[bool, int, int]],
                 events: EventBus | None = None, state: Callable[[], DispatchState] | None = None) -> None:
        self.db = db
        self._errors: dict[tuple[str, str], dict[str, str]] = {}  # a failed task's row: its error
        self.progress = progress
        self.state = state  # the dispatcher's state: the node a drifted task left
        self.events = EventBus() if events is None else events
        self.events.persist = self.record
        self.writer: mdb.BatchWriter | None = None
        self._flushing: asyncio.Future[int] | None = None  # a reader's flush of the writer (written)
        self._tx: dict[tuple[str, str], Transitioned] = {}
        self._events: list[Event] = []  # published, to be written
        self._tiles: dict[str, list[mdb.TileLocation]] = defaultdict(list)
        # Kernel times of successful replies, until their done transition is written. The
        # shell reports the reply before the transition, and a flush (``written``) may come
        # between the two, so a time not yet matched waits one more flush (``_late``); one
        # whose transition never comes (a reply to a job that failed meanwhile) is dropped
        # after that.
        self._times: dict[tuple[str, str], Timings] = {}
        self._late: dict[tuple[str, str], Timings] = {}
        # Jobs dispatched while their rows are still being stored: their writes wait.
        self._held: set[str] = set()
        # Jobs' ends (state, tasks done, error), written by the next flush after the job's
        # other rows (a held job's once it is released): off the path of the answer to a
        # waiting submit (docs/runtime.md)
        self._ends: dict[str, tuple[str, int, str | None]] = {}

    def hold(self, job: str) -> None:
        """Keep ``job``'s writes back until :meth:`release` (its rows are being inserted)."""
        self._held.add(job)

    def forget(self, job: str) -> None:
        """Drop everything held for ``job`` (its rows could not be stored)."""
        self._ends.pop(job, None)
        self._tx = {k: t for k, t in self._tx.items() if k[0] != job}
        self._events = [e for e in self._events if e.job != job]
        self._tiles.pop(job, None)
        self._times = {k: v for k, v in self._times.items() if k[0] != job}
        self._late = {k: v for k, v in self._late.items() if k[0] != job}

    def release(self, job: str) -> None:
        self._held.discard(job)

    async def written(self, timeout_s: float = WRITTEN_WAIT_S) -> None:
        """Once everything recorded so far is in the metadb, or after ``timeout_s``: a read of
        a job that has just ended finds its last rows (they trail the job's end by up to a
        period and a batch), and a database that is slow, locked or refusing holds the read up
        no longer than that (the writer goes on; the read may find rows that trail)."""
        self.flush()
        if self.writer is None:
            return
        done = self._flushing
        if done is None or done.done():  # one flush thread at a time, however many readers wait
            done = self._flushing = asyncio.ensure_future(asyncio.to_thread(self.writer.flush))
            done.add_done_callback(lambda f: f.cancelled() or f.exception())  # (logged by the writer)
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout_s)
        except (TimeoutError, mdb.BatchWriteError) as e:
            log.info("reading rows the journal has not written yet: %s", e or "the database is slow")

    def new_job(self, rows: mdb.JobRows) -> None:
        """Store a small job's rows with the writer's next batch (before its other writes);
        without a writer (a journal not opened), at once. BatchWriteError when the writer
        is full (the database is down or too slow): the job is not stored."""
        if self.writer is None:
            with self.db.transaction() as s:
                mdb.write_job_rows(s.connection(), rows)
            return
        self.writer.new_job(rows)

    def inserting(self, job: str) -> bool:
        """Are ``job``'s rows queued to the writer, not in the metadb yet (a compiled step)?"""
        return self.writer is not None and self.writer.inserting(job)

    def released(self, job: str) -> None:
        """``job`` was released: its output locations not written yet are dropped (they
        would name deleted tiles). A compiled step is released by the next step's submit,
        mostly before the journal's next flush: its tiles rows are then never written."""
        self._tiles.pop(job, None)

    def note(self, job: str, kind: str) -> bool:
        """Write an event of ``kind`` (no payload) for ``job`` with the next batch, if the
        writer knows the job's row (a job it stored or was told of); whether it was queued
        (if not, the caller writes it itself)."""
        w = self.writer
        if w is None or not w.knows(job):
            return False
        try:
            w.event(job, kind, at=time.time())
        except mdb.MetaDBError as e:
            log.error("cannot record %s of job %s: %s", kind, job, e)
        return True

    def stored(self, job: str, tasks: list[str]) -> None:
        """A job's rows were just stored: its writes need no check that they exist."""
        if self.writer is not None:
            self.writer.known(job, tasks)

    def open(self) -> None:
        self.writer = mdb.BatchWriter(self.db, max_items=2000, max_delay=0.05)

    def close(self) -> None:
        """Flush everything (blocking: call it in a thread)."""
        self.flush()
        if self.writer is not None:
            try:
                self.writer.close()
            except mdb.BatchWriteError as e:
                log.error("metadb writes lost at shutdown: %s", e)

    def transitions(self, ts: list[Transitioned]) -> None:
        held = self._held
        for t in ts:
            if held and t.finish == "ready" and t.job in held and t.stimulus_id == f"submit:{t.job}":
                # A job being stored: its rows are inserted in exactly the state the submit
                # gives (ready or pending). Rewriting them would cost a row update per task.
                continue
            self._tx[(t.job, t.task)] = t
            if t.start in ("dispatched", "done") and t.finish in ("ready", "pending", "failed"):
                self.events.publish(TASK_EVENTS[t.start, t.finish], job=t.job, task=t.task,
                                    node=self._left(t), attempt=t.attempt, reason=t.stimulus_id[:128],
                                    **{"from": t.start, "to": t.finish})
            elif t.start == t.finish == "done":  # a holder died: the tile is read from a persistence
                # target (the transition's node names it: store:<kind>) instead of computed again
                self.events.publish(PERSISTED_READ, job=t.job, task=t.task, node=t.node, attempt=t.attempt,
                                    reason=t.stimulus_id[:128])

    def task_failed(self, job: str, task: str, kind: str, message: str) -> None:
        """The error of the task that failed ``job``: written to its row (``error_kind``,
        ``error_message``) with the next flush. A row's kinds are the metadb's (user, infra):
        a job-level one (its deadline) is the job's, not a task's, and is not written."""
        if kind in ERROR_KINDS:
            self._errors[(job, task)] = {"error_kind": kind, "error_message": message}

    def _left(self, t: Transitioned) -> str | None:
        """The node a task left (a drift clears its node: its previous transition says)."""
        if t.node is not None or self.state is None:
            return t.node
        js = self.state().jobs.get(t.job)
        rec = js.tasks.get(t.task) if js is not None else None
        return rec.log[-2].node if rec is not None and len(rec.log) > 1 else None

    def record(self, e: Event) -> None:
        """An event the bus published: written with the next flush (the bus's ``persist``)."""
        if self.writer is not None:
            self._events.append(e)

    def output(self, job: str, task: str, node: str, r: Reply, *, tiles: bool = True) -> None:
        """A successful reply of ``task`` on ``node`` (call it before the task's done
        transition): its kernel times go into the task row with that transition, and with
        ``tiles`` its outputs get rows in the tiles table."""
        self._times[job, task] = r.timings
        if tiles:
            for o in r.outputs:  # a grouped task's tiles are <job>.<node>: one row per node
                name = o.tile[len(job) + 1:] if o.tile.startswith(job + ".") else task
                self._tiles[job].append(mdb.TileLocation(name, (), tuple(o.shape), o.dtype, o.bytes, node))

    async def run(self, period_s: float = 0.2) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                self.flush()
            except Exception:
                log.exception("persisting dispatcher state failed (retrying)")

    def flush(self) -> None:
        """Queue the latest transition of each task, the unusual ones as events, and the
        output tile locations (one BatchWriter call per job: thousands of tasks at a time)."""
        w = self.writer
        if w is None or not (self._tx or self._events or self._tiles or self._errors or self._ends):
            return
        ends, self._ends = self._ends, {}
        tx, self._tx = self._tx, {}
        errors, self._errors = self._errors, {}
        events, self._events = self._events, []
        tiles = self._take_tiles()
        times, self._times = self._times, {}
        late, self._late = self._late, {}
        if self._held:
            self._tx = {k: t for k, t in tx.items() if k[0] in self._held}
            self._events = [t for t in events if t.job in self._held]
            tx = {k: t for k, t in tx.items() if k[0] not in self._held}
            events = [t for t in events if t.job not in self._held]
            for src in (late, times):  # a held job's times wait with its transitions, unaged
                for k in [k for k in src if k[0] in self._held]:
                    self._times[k] = src.pop(k)
            self._errors = {k: e for k, e in errors.items() if k[0] in self._held}
            errors = {k: e for k, e in errors.items() if k[0] not in self._held}
            self._ends = {j: e for j, e in ends.items() if j in self._held}
            ends = {j: e for j, e in ends.items() if j not in self._held}
        by_job: dict[str, list[tuple[str, str, dict[str, Any]]]] = defaultdict(list)
        for key, t in tx.items():
            fields: dict[str, Any] = {"attempt": t.attempt, "node": t.node}
            finish = t.finish
            if finish == "done":
                kt = times.pop(key, None) or late.pop(key, None)
                if kt is None:  # no reply seen (a journal fed by hand): the time it was reported
                    fields["finished_at"] = t.at
                else:
                    fields["started_at"] = kt.start
                    fields["finished_at"] = kt.end
                    fields["actual_s"] = kt.end - kt.start
            elif finish == "dispatched":
                fields["started_at"] = t.at
            elif finish in ("failed", "cancelled"):
                fields["finished_at"] = t.at
                fields.update(errors.pop(key, {}) if finish == "failed" else {})
            by_job[key[0]].append((key[1], TASK_STATE[finish], fields))
        for (job, task), error in errors.items():  # its failed transition was written before
            by_job[job].append((task, "failed", error))
        self._late = times  # not matched yet: their transition comes with the next flush
        for job, changes in by_job.items():
            try:
                w.transitions(job, changes)
                if job in tiles:
                    w.tiles(job, tiles.pop(job))
                running, done, total = self.progress(job)
                if running:
                    w.job_progress(job, tasks_done=done)
                    self.events.progress(job, done, total)
            except mdb.MetaDBError as e:  # one job's bad record must not lose the others'
                log.error("cannot record the tasks of job %s: %s", job, e)
        for job, locs in tiles.items():
            try:
                w.tiles(job, locs)
            except mdb.MetaDBError as e:
                log.error("cannot record the tiles of job %s: %s", job, e)
        self._write_events(w, events)
        for job, (state, done, error) in ends.items():
            try:
                w.job_progress(job, state=state, tasks_done=done, error=error)
            except mdb.MetaDBError as e:
                log.error("cannot record the end of job %s: %s", job, e)

    @staticmethod
    def _write_events(w: mdb.BatchWriter, events: list[Event]) -> None:
        for e in events:
            try:
                w.event(e.job, e.kind, task_id=e.task, node=e.node, at=e.at, payload=e.data, seq=e.id,
                        stimulus_id=e.data.get("reason") if e.task is not None else None)
            except mdb.MetaDBError as err:
                log.error("cannot record event %d (%s of job %s): %s", e.id, e.kind, e.job, err)

    def job_started(self, job: str, owner: str | None, tasks: int, done: int, *, resumed: bool) -> None:
        """Publish a job's start: ``job.submitted`` (not for a job resumed from the metadb)
        and ``job.running``; its later events carry ``owner`` (who may see them)."""
        self.events.own(job, owner)
        if not resumed:
            self.events.publish("job.submitted", job=job, owner=owner, tasks=tasks)
        self.events.publish("job.running", job=job, tasks=tasks, done=done, resumed=resumed)

    def job_ended(self, job: str, state: str, done: int, error: str | None,
                  failure: dict[str, Any] | None = None, **data: Any) -> None:
        """Record a job's end and publish it (``job.done``, ``job.cancelled``, with ``done``
        and ``data``; ``job.failed``, whose data is ``failure``: the failed job's error body,
        kind, message, node, op; so that its status reads the same once the job has left
        the scheduler's memory). The event is published once the dispatcher's current step
        is carried out: the shell reports a job's end before that step's task transitions,
        and a job's end must be its last event (a watcher stops there)."""
        if state == "failed" and failure is not None:
            node = failure.get("node")
            end = (FAILED, failure, node if isinstance(node, str) else None)
        else:
            end = (END_EVENTS.get(state, f"job.{state}"), {"done": done, **data}, None)
        try:
            asyncio.get_running_loop().call_soon(lambda: self.events.publish_data(end[0], end[1], job=job,
                                                                                  node=end[2]))
        except RuntimeError:  # no event loop (a journal fed by hand)
            self.events.publish_data(end[0], end[1], job=job, node=end[2])
        if self.writer is not None:
            self._ends[job] = (state, done, error)

    def _take_tiles(self) -> dict[str, list[mdb.TileLocation]]:
        """The tile locations to write now (those of held jobs stay)."""
        tiles, self._tiles = self._tiles, defaultdict(list)
        for job in self._held & tiles.keys():
            self._tiles[job] = tiles.pop(job)
        return tiles
