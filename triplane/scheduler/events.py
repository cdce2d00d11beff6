"""The scheduler's event stream: what happened to jobs, their tasks and the executors, in
one numbered sequence (docs/observability.md).

``EventBus.publish`` gives each event the next id (strictly increasing across the
scheduler; a new process, or a standby taking the lead, continues from the largest id in
the metadb's ``events`` table), keeps it in an in-memory ring buffer, hands it to every
matching subscriber and to ``persist`` (the journal, which writes it to the metadb in its
batches). It never blocks and never waits for a subscriber: it is called on the event loop
from the dispatcher's hooks.

Which events there are (``KINDS``): a job's ``job.submitted``, ``job.running``,
``job.progress`` (at most ``PROGRESS_PER_S`` a second per job), and its end (``job.done``,
``job.failed``, ``job.cancelled``); the unusual task transitions (``task.failed``,
``task.drifted``: a task taken off its node and sent again, ``task.recomputed``: a done
task run again because its output tile was lost); executors' ``node.up`` and
``node.down`` (and ``node.drained``/``node.undrained`` when the admin API drains one).
There is no event per task on the normal path: a 100,000-task job makes a handful.

Slow consumers (the policy): each subscription has a bounded queue (``queue_size``
events). A subscriber that lets it fill is cut off from the live feed at once -- the
publisher drops its queue rather than wait -- and its next read catches up by id from
the ring buffer and then the metadb, starting after the last event it was given, and
re-attaches to the live feed once it is current. So a slow reader costs the dispatcher
nothing, and it sees every event once, in id order, with no gap and no duplicate. A client
whose connection drops does the same by reconnecting with its last id (``after``; SSE's
``Last-Event-ID``).

Replay reaches back as far as the metadb keeps events (the jobs that retention keeps, and
every node event). The ring buffer (``ring_size`` events) serves recent ids without a
database read; an event leaves it long after the journal has written it (the journal
flushes every 0.2 s: the ring would have to take ``ring_size`` events in that time).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from triplane import metadb as mdb

log = logging.getLogger(__name__)

__all__ = ["KINDS", "PROGRESS_PER_S", "Event", "EventBus", "Subscription"]

KINDS = frozenset({
    # a job's life
    "job.submitted", "job.running", "job.progress", "job.done", "job.failed", "job.cancelled",
    # the unusual task transitions (the normal ones are in the tasks table)
    "task.failed", "task.drifted", "task.recomputed",
    # the executors
    "node.up", "node.down", "node.drained", "node.undrained",
})
PROGRESS_PER_S = 2.0  # job.progress events per job and second, at most
RING_SIZE = 10_000
QUEUE_SIZE = 1_000
DB_PAGE = 1_000  # events read from the metadb at a time when catching up
RETRY_S = 1.0  # a subscriber catching up from a metadb that fails tries again after this


@dataclass(frozen=True)
class Event:
    """One event. ``owner``: the name of the token that submitted the event's job (who may
    see it; None for node events and jobs submitted without a token); not part of the
    event's body."""

    id: int
    at: float  # unix seconds
    kind: str
    job: str | None = None
    task: str | None = None
    node: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    owner: str | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "kind": self.kind, "job": self.job, "task": self.task,
                "node": self.node, "data": self.data}


@dataclass(frozen=True)
class _Filter:
    job: str | None = None
    kinds: frozenset[str] | None = None
    owner: str | None = None  # None: every event; a name: that owner's jobs' events only

    def __call__(self, e: Event) -> bool:
        return ((self.job is None or e.job == self.job) and (self.kinds is None or e.kind in self.kinds)
                and (self.owner is None or (e.owner == self.owner and e.job is not None)))


class Subscription:
    """An async iterator of the events after ``after`` that pass its filter, in id order
    (see the module doc for what happens when it falls behind). ``close()`` (or leaving an
    ``async with``) detaches it."""

    def __init__(self, bus: EventBus, flt: _Filter, after: int, queue_size: int) -> None:
        self._bus, self._filter, self.last = bus, flt, after
        self._size = queue_size
        self._queue: deque[Event] = deque()
        self._wake = asyncio.Event()
        self.attached = False  # on the live feed (else it catches up first)
        self.cut_offs = 0  # times it fell behind and was cut off
        self.closed = False

    # the publisher's side (event loop, never blocks)
    def _offer(self, e: Event) -> None:
        if len(self._queue) >= self._size:
            self._queue.clear()  # cut off: it catches up from the ring / metadb after self.last
            self.attached = False
            self.cut_offs += 1
            self._bus._detach(self)
        else:
            self._queue.append(e)
        self._wake.set()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while not self.closed:
            if self._queue:
                e = self._queue.popleft()
                self.last = e.id
                return e
            if not self.attached:
                await self._catch_up()
                continue
            self._wake.clear()
            await self._wake.wait()
        raise StopAsyncIteration

    async def _catch_up(self) -> None:
        """Fill the queue with the events after ``last`` (a page at a time), and re-attach
        once the ring buffer holds all of them: the ring read and the attach happen in one
        step of the event loop, so no event published meanwhile is missed or seen twice."""
        bus = self._bus
        if not bus.ring_covers(self.last):
            try:
                page = await asyncio.to_thread(bus.load, self.last, self._filter, DB_PAGE, bus.ring_start())
            except Exception as e:  # the metadb failed; no skipping ahead: the reader waits for it
                log.warning("event subscriber waits for the metadb: %s", e)
                await asyncio.sleep(RETRY_S)
                return
            if page:
                self._queue.extend(page)
                return
            if not bus.ring_covers(self.last):  # none left below the ring
                self.last = max(self.last, bus.ring_start() - 1)
        events = bus.ring_after(self.last, self._filter)
        self._queue.extend(events[:self._size])
        if len(events) <= self._size:
            self.attached = True
            bus._attach(self)

    def close(self) -> None:
        self.closed = True
        self._bus._detach(self)
        self._wake.set()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    """See the module doc. ``db``: the metadb to continue ids from and to replay from
    (None: the ring buffer only). ``persist``: called with each event published (the
    journal; it must not block)."""

    def __init__(self, db: mdb.MetaDB | None = None, *, persist: Callable[[Event], None] | None = None,
                 ring_size: int = RING_SIZE, queue_size: int = QUEUE_SIZE) -> None:
        self.db = db
        self.persist = persist
        self.sinks: list[Callable[[Event], None]] = []  # also told of every event (metrics)
        self.queue_size = queue_size
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._next = 1
        self._first = 1  # the first id this bus published (older ones: the metadb only)
        self._subs: set[Subscription] = set()
        self._owners: dict[str, str | None] = {}  # job -> owner, for the jobs with events still to come
        self._progress_at: dict[str, float] = {}
        self.published = 0

    def open(self) -> None:
        """Continue the ids from the metadb's largest (blocking: call it in a thread, on
        start and when taking the lead)."""
        if self.db is None:
            return
        with self.db.read() as s:
            top = mdb.max_event_seq(s)
        start = max(self._next, top + 1)
        if start != self._next:
            self._next = self._first = start
            self._ring.clear()

    # --- publishing (event loop) -----------------------------------------------------------

    def own(self, job: str, owner: str | None) -> None:
        """Say whose ``job`` is (its later events carry it, for the owner filter)."""
        self._owners[job] = owner

    def publish(self, kind: str, *, job: str | None = None, task: str | None = None,
                node: str | None = None, **data: Any) -> Event:
        """Number, keep and hand out one event; it never blocks."""
        return self.publish_data(kind, data, job=job, task=task, node=node)

    def publish_data(self, kind: str, data: dict[str, Any], *, job: str | None = None,
                     task: str | None = None, node: str | None = None) -> Event:
        """``publish`` with the data as one dict (whose keys may be any: ``kind``, ``node``)."""
        e = Event(self._next, time.time(), kind, job, task, node, data,
                  self._owners.get(job) if job is not None else None)
        self._next += 1
        self.published += 1
        self._ring.append(e)
        for sub in list(self._subs):
            if sub._filter(e):
                sub._offer(e)
        if self.persist is not None:
            self.persist(e)
        for sink in self.sinks:
            sink(e)
        if job is not None and kind in ("job.done", "job.failed", "job.cancelled"):
            self._owners.pop(job, None)
            self._progress_at.pop(job, None)
        return e

    def progress(self, job: str, done: int, total: int) -> Event | None:
        """A ``job.progress`` event, unless the job had one less than 1/PROGRESS_PER_S ago."""
        now = time.monotonic()
        if now - self._progress_at.get(job, -1e9) < 1.0 / PROGRESS_PER_S:
            return None
        self._progress_at[job] = now
        return self.publish("job.progress", job=job, done=done, total=total)

    # --- reading ----------------------------------------------------------------------------

    def subscribe(self, *, job: str | None = None, after: int | None = None,
                  kinds: Iterable[str] | None = None, owner: str | None = None) -> Subscription:
        """The events after ``after`` (None: from now on) of ``job`` / ``kinds`` / ``owner``."""
        flt = _Filter(job, frozenset(kinds) if kinds is not None else None, owner)
        start = self._next - 1 if after is None else max(0, after)
        sub = Subscription(self, flt, start, self.queue_size)
        if after is None:
            sub.attached = True
            self._attach(sub)
        return sub

    def query(self, *, job: str | None = None, kinds: Collection[str] | None = None,
              after: int | None = None, limit: int = 100, owner: str | None = None) -> list[Event]:
        """Up to ``limit`` events after ``after`` (id order); reads the metadb (blocking) only
        for ids older than the ring buffer's."""
        flt = _Filter(job, frozenset(kinds) if kinds is not None else None, owner)
        last = 0 if after is None else max(0, after)
        out: list[Event] = []
        if not self.ring_covers(last):
            out = self.load(last, flt, limit, self.ring_start())
            if len(out) >= limit:
                return out[:limit]
            last = max(last, self.ring_start() - 1)
        return out + self.ring_after(last, flt)[:limit - len(out)]

    async def aquery(self, *, job: str | None = None, kinds: Collection[str] | None = None,
                     after: int | None = None, limit: int = 100, owner: str | None = None) -> list[Event]:
        """``query`` with its metadb read in a worker thread (for the event loop)."""
        flt = _Filter(job, frozenset(kinds) if kinds is not None else None, owner)
        last = 0 if after is None else max(0, after)
        out: list[Event] = []
        if not self.ring_covers(last):
            out = await asyncio.to_thread(self.load, last, flt, limit, self.ring_start())
            if len(out) >= limit:
                return out[:limit]
            last = max(last, self.ring_start() - 1)
        return out + self.ring_after(last, flt)[:limit - len(out)]

    @property
    def last_id(self) -> int:
        return self._next - 1

    def ring_start(self) -> int:
        """The id of the oldest event the ring buffer still holds (or would hold next)."""
        return self._ring[0].id if self._ring else self._next

    def ring_covers(self, after: int) -> bool:
        """Whether every event after ``after`` is in the ring buffer (or not yet published)."""
        return after + 1 >= self.ring_start() and (after + 1 >= self._first or self.db is None)

    def ring_after(self, after: int, flt: _Filter) -> list[Event]:
        ring = self._ring
        if not ring or ring[-1].id <= after:
            return []
        skip = max(0, after + 1 - ring[0].id)  # ids in the ring are consecutive
        return [e for e in itertools.islice(ring, skip, None) if flt(e)]

    def load(self, after: int, flt: _Filter, limit: int, before: int) -> list[Event]:
        """Events ``after`` < id < ``before`` from the metadb (blocking); [] without one.
        Raises what the metadb raises (MetaDBError, SQLAlchemy errors)."""
        if self.db is None:
            return []
        with self.db.read() as s:
            rows = mdb.stream_events(s, after=after, before=before, job=flt.job,
                                     kinds=sorted(flt.kinds) if flt.kinds is not None else None,
                                     owner=flt.owner, limit=limit)
        return [Event(r.seq or 0, r.at, r.kind, r.job_id, r.task_id, r.node,
                      r.payload if isinstance(r.payload, dict) else {}, r.owner) for r in rows]

    # subscriptions on the live feed
    def _attach(self, sub: Subscription) -> None:
        if not sub.closed:
            self._subs.add(sub)

    def _detach(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    @property
    def subscribers(self) -> int:
        return len(self._subs)
