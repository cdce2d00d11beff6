"""Dynamic batching: concurrent predict requests stacked along the batch axis.

Requests wait in one queue. A replica that is free forms the next batch: it takes the
oldest request, then waits until the rows of the requests that can join it (the same
per-row shapes and dtypes) reach ``max_batch`` or until ``max_wait_s`` has passed since
that oldest request arrived, whichever comes first. One replica forms a batch at a time
(the others wait their turn), so a batch is never split between two replicas and a
request is never taken twice. ``max_batch=1`` (or ``max_wait_s=0`` with no company
waiting) runs every request on its own.

The stacked batch is padded up to a *bucket* (the next power of two, at most
``max_batch``) by repeating its first row, so that a model sees few distinct batch sizes
and the cluster's compiled-step cache holds one plan per bucket instead of one per size;
the padding rows' outputs are dropped.

A full queue (``max_queue`` requests) refuses new ones with ``Unavailable`` (503) rather
than growing without bound; so does a closed batcher.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from triplane.scheduler.errors import Unavailable

__all__ = ["Answer", "Batch", "Batcher", "Pending", "bucket", "buckets"]


def buckets(max_batch: int) -> list[int]:
    """The batch sizes a model is run at: powers of two below ``max_batch``, and it."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def bucket(rows: int, max_batch: int) -> int:
    """The smallest bucket holding ``rows`` (``rows`` itself above ``max_batch``)."""
    return next((b for b in buckets(max_batch) if b >= rows), rows)


@dataclass(frozen=True)
class Answer:
    """A request's outputs and the model version that computed them."""

    outputs: list[np.ndarray]
    version: str


@dataclass
class Pending:
    """One request: its inputs (signature order), its rows and when it arrived."""

    arrays: list[np.ndarray]
    rows: int
    arrived: float = field(default_factory=time.monotonic)
    future: Future[Answer] = field(default_factory=Future)

    @property
    def key(self) -> tuple[object, ...]:
        return tuple((a.shape[1:], a.dtype.str) for a in self.arrays)


@dataclass
class Batch:
    """Requests run together: ``arrays`` stacked and padded to ``size`` rows."""

    requests: list[Pending]
    arrays: list[np.ndarray]
    rows: int  # real rows
    size: int  # rows after padding

    def split(self, outputs: Sequence[np.ndarray], version: str = "") -> None:
        """Give each request its rows of ``outputs`` (padding rows dropped), computed by
        model ``version``."""
        at = 0
        for r in self.requests:
            if not r.future.done():
                r.future.set_result(Answer([o[at:at + r.rows] for o in outputs], version))
            at += r.rows

    def fail(self, error: BaseException) -> None:
        for r in self.requests:
            if not r.future.done():
                r.future.set_exception(error)


def stack(requests: list[Pending], max_batch: int, batching: bool) -> Batch:
    rows = sum(r.rows for r in requests)
    if not batching:
        return Batch(requests, requests[0].arrays, rows, rows)
    size = bucket(rows, max_batch)
    arrays = []
    for i in range(len(requests[0].arrays)):
        parts = [r.arrays[i] for r in requests]
        if size > rows:
            first = parts[0][:1]
            parts.append(np.broadcast_to(first, (size - rows, *first.shape[1:])))
        arrays.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0))
    return Batch(requests, arrays, rows, size)


class Batcher:
    """The queue of waiting requests and the rule that forms batches from it.

    ``batching=False`` (a model without a batch axis) runs each request alone whatever
    ``max_batch`` says."""

    def __init__(self, max_batch: int = 32, max_wait_s: float = 0.005, *, batching: bool = True,
                 max_queue: int = 4096) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self.batching = batching and max_batch > 1
        self._queue: deque[Pending] = deque()
        self._cond = threading.Condition()
        self._forming = threading.Lock()  # one replica forms a batch at a time
        self._closed = False

    def submit(self, arrays: list[np.ndarray], rows: int) -> Future[Answer]:
        """Queue a request; its future resolves to its :class:`Answer` (or the run's error)."""
        p = Pending(arrays, rows)
        with self._cond:
            if self._closed:
                raise Unavailable("the model server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise Unavailable(f"the model server has {len(self._queue)} requests waiting "
                                  f"(at most {self.max_queue}): try again shortly")
            self._queue.append(p)
            self._cond.notify_all()
        return p.future

    def __len__(self) -> int:
        return len(self._queue)

    def next_batch(self, timeout_s: float = 0.5) -> Batch | None:
        """The next batch to run, or None if no request came within ``timeout_s`` (or the
        batcher is closed and empty)."""
        if not self._forming.acquire(timeout=timeout_s):
            return None
        try:
            with self._cond:
                if not self._cond.wait_for(lambda: self._queue or self._closed, timeout_s) or not self._queue:
                    return None
                if self.batching:
                    deadline = self._queue[0].arrived + self.max_wait_s
                    while not self._closed and self._joinable_rows() < self.max_batch:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                taken = self._take()
        finally:
            self._forming.release()
        return stack(taken, self.max_batch, self.batching)

    def _joinable_rows(self) -> int:
        key = self._queue[0].key
        return sum(p.rows for p in self._queue if p.key == key)

    def _take(self) -> list[Pending]:
        first = self._queue.popleft()
        taken, rows = [first], first.rows
        if not self.batching:
            return taken
        keep: deque[Pending] = deque()
        while self._queue:
            p = self._queue.popleft()
            if p.key == first.key and rows + p.rows <= self.max_batch:
                taken.append(p)
                rows += p.rows
            else:
                keep.append(p)
        self._queue = keep
        return taken

    def close(self) -> None:
        """Refuse new requests; those queued are still handed out."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail_waiting(self, error: BaseException) -> None:
        with self._cond:
            while self._queue:
                p = self._queue.popleft()
                if not p.future.done():
                    p.future.set_exception(error)
