"""Batched persistence of the dispatcher's state: task transitions, drift events, tiles.

The hot path only fills dicts on the event loop (``transitions``, ``output``); every
``period_s`` the journal hands the *latest* transition of each task to the metadb
``BatchWriter`` (so a task that went ready -> dispatched -> done in between costs one
row update), appends an event row only for the unusual transitions (drift, lineage
recompute, failure: the normal path is in the tasks table already), and queues the output
tile locations beside them (written in the same batches, one transaction each). A
database error is logged and the next period tries again; nothing here blocks the event
loop.

A done task's row gets its kernel's own times from the executor's reply (``started_at``
/ ``finished_at``: kernel start and end, unix seconds on the executor's clock;
``actual_s``: end - start), written with the done transition itself: no extra row
update. A row's ``actual_s`` is what says its times are the kernel's (docs/metadb.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from triplane import metadb as mdb
from triplane.proto.packet import Reply, Timings
from triplane.scheduler.dispatch.state import Transitioned

PERSISTED_READ = "tile.persisted_read"  # an event: a done task's holder died, its tile is read from
# the persistence target named by the row's node (store:<kind>) instead of being computed again

log = logging.getLogger(__name__)

FAILED = "job.failed"  # the event holding a failed job's error body

TASK_STATE = {
    "pending": "pending",
    "ready": "ready",
    "dispatched": "dispatched",
    "done": "done",
    "failed": "failed",
    "cancelled": "cancelled",
}


class Journal:
    """Collects what the metadb must learn; ``flush`` queues it to the BatchWriter.
    ``progress(job)`` gives (running?, tasks done) for the job counters."""

    def __init__(self, db: mdb.MetaDB, progress: Callable[[str], tuple[bool, int]]) -> None:
        self.db = db
        self.progress = progress
        self.writer: mdb.BatchWriter | None = None
        self._tx: dict[tuple[str, str], Transitioned] = {}
        self._events: list[Transitioned] = []
        self._tiles: dict[str, list[mdb.TileLocation]] = defaultdict(list)
        # Kernel times of successful replies, until their done transition is written. The
        # shell reports the reply before the transition, and a job's end flushes between
        # the two (job_ended), so a time not yet matched waits one more flush (``_late``);
        # one whose transition never comes (a reply to a job that failed meanwhile) is
        # dropped after that.
        self._times: dict[tuple[str, str], Timings] = {}
        self._late: dict[tuple[str, str], Timings] = {}
        # Jobs dispatched while their rows are still being stored: their writes wait.
        self._held: set[str] = set()
        self._ended: dict[str, tuple[str, int, str | None, dict[str, Any] | None]] = {}

    def hold(self, job: str) -> None:
        """Keep ``job``'s writes back until :meth:`release` (its rows are being inserted)."""
        self._held.add(job)

    def forget(self, job: str) -> None:
        """Drop everything held for ``job`` (its rows could not be stored)."""
        self._ended.pop(job, None)
        self._tx = {k: t for k, t in self._tx.items() if k[0] != job}
        self._events = [t for t in self._events if t.job != job]
        self._tiles.pop(job, None)
        self._times = {k: v for k, v in self._times.items() if k[0] != job}
        self._late = {k: v for k, v in self._late.items() if k[0] != job}

    def release(self, job: str) -> None:
        self._held.discard(job)
        ended = self._ended.pop(job, None)
        if ended is not None:
            self.job_ended(job, *ended)

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
            # the unusual: a drift or lineage, or (done -> done) a holder died and the tile is
            # read from a persistence target
            if ((t.start in ("dispatched", "done") and t.finish in ("ready", "pending", "failed"))
                    or t.start == t.finish == "done"):
                self._events.append(t)

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
        if w is None or not (self._tx or self._events or self._tiles):
            return
        tx, self._tx = self._tx, {}
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
            by_job[key[0]].append((key[1], TASK_STATE[finish], fields))
        self._late = times  # not matched yet: their transition comes with the next flush
        for job, changes in by_job.items():
            try:
                w.transitions(job, changes)
                if job in tiles:
                    w.tiles(job, tiles.pop(job))
                running, done = self.progress(job)
                if running:
                    w.job_progress(job, tasks_done=done)
            except mdb.MetaDBError as e:  # one job's bad record must not lose the others'
                log.error("cannot record the tasks of job %s: %s", job, e)
        for job, locs in tiles.items():
            try:
                w.tiles(job, locs)
            except mdb.MetaDBError as e:
                log.error("cannot record the tiles of job %s: %s", job, e)
        for t in events:
            try:
                w.event(
                    t.job,
                    f"task.{t.finish}" if t.start != t.finish else PERSISTED_READ,
                    task_id=t.task,
                    stimulus_id=t.stimulus_id[:128],
                    at=t.at,
                    payload={"from": t.start, "attempt": t.attempt, "node": t.node},
                )
            except mdb.MetaDBError as e:
                log.error("cannot record an event of job %s: %s", t.job, e)

    def job_ended(self, job: str, state: str, done: int, error: str | None,
                  failure: dict[str, Any] | None = None) -> None:
        """Record a job's end; ``failure`` (a failed job's error body: kind, message, node,
        op) becomes a ``job.failed`` event, so that its status reads the same once the job
        has left the scheduler's memory."""
        if self.writer is None:
            return
        if job in self._held:
            self._ended[job] = (state, done, error, failure)
            return
        try:
            self.flush()
            self.writer.job_progress(job, state=state, tasks_done=done, error=error)
            if failure is not None:
                self.writer.event(job, FAILED, payload=failure)
        except mdb.MetaDBError as e:
            log.error("cannot record the end of job %s: %s", job, e)

    def _take_tiles(self) -> dict[str, list[mdb.TileLocation]]:
        """The tile locations to write now (those of held jobs stay)."""
        tiles, self._tiles = self._tiles, defaultdict(list)
        for job in self._held & tiles.keys():
            self._tiles[job] = tiles.pop(job)
        return tiles
