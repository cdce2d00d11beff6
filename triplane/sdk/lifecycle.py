"""What a cluster session keeps alive, and for how long (docs/cluster.md, "Lifecycle").

* :class:`Keeper` -- one daemon thread per :class:`~triplane.sdk.remote.RemoteSession`. It
  sends the releases that finalizers and ``evaluate`` queue (``DELETE /v1/jobs/{id}``,
  ``DELETE /v1/tensors/{id}``; a finalizer only appends to a queue, never does I/O) in
  batches, and renews the client session lease every third of its TTL so that the
  scheduler knows the client is alive. Best effort: a release that fails is logged at
  debug level and left to the lease (the scheduler frees what an ended session held).
* :class:`Uploads` -- host array -> upload id by identity (weak references), telling the
  session when an array dies so that its upload is released.
* :class:`ProgressBar` -- a ``rich`` progress bar for a job that takes longer than
  ``DELAY_S``, on a terminal only (stderr a TTY), off with :func:`set_progress`.
* :func:`deferred_interrupt` -- a Ctrl-C during a submit is held until its answer names
  the job to cancel.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["DELAY_S", "Keeper", "ProgressBar", "Uploads", "deferred_interrupt", "progress_enabled",
           "set_progress"]

log = logging.getLogger(__name__)

DELAY_S = 1.0  # a job shorter than this shows no bar
_progress = True


def set_progress(enabled: bool) -> None:
    """Show (default) or hide the progress bar of cluster jobs longer than about a second.
    It is never shown when stderr is not a terminal."""
    global _progress
    _progress = bool(enabled)


def progress_enabled() -> bool:
    return _progress and sys.stderr is not None and sys.stderr.isatty()


class Uploads:
    """Host array -> uploaded tensor id, by identity, without keeping arrays alive.

    Read-only arrays (every SDK tensor value is one) are trusted not to change, so identity
    suffices; a writable array is also keyed by a digest of its bytes, so an in-place edit
    uploads again instead of computing on stale data. ``released(upload_id)`` is called
    when an array dies or is uploaded again (from a weakref callback: it must not do I/O)."""

    def __init__(self, released: Callable[[str], None] | None = None) -> None:
        self._by_id: dict[int, tuple[weakref.ref[np.ndarray], str, bytes | None]] = {}
        self._released = released

    @staticmethod
    def _digest(arr: np.ndarray) -> bytes | None:
        if not arr.flags.writeable:
            return None
        return hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).digest()

    def get(self, arr: np.ndarray) -> str | None:
        hit = self._by_id.get(id(arr))
        if hit is None or hit[0]() is not arr:
            return None
        return hit[1] if hit[2] == self._digest(arr) else None

    def put(self, arr: np.ndarray, upload_id: str) -> None:
        key = id(arr)

        def forget(ref: object, key: int = key) -> None:
            hit = self._by_id.get(key)
            if hit is not None and hit[0] is ref:
                del self._by_id[key]
                if self._released is not None:
                    self._released(hit[1])

        try:
            ref = weakref.ref(arr, forget)
        except TypeError:  # not weak-referenceable: do not cache rather than leak
            if self._released is not None:
                self._released(upload_id)  # used by the job in flight only
            return
        old = self._by_id.get(key)
        self._by_id[key] = (ref, upload_id, self._digest(arr))
        if old is not None and old[1] != upload_id and self._released is not None:
            self._released(old[1])  # an edited array uploaded again: the old bytes go

    def clear(self) -> list[str]:
        """Forget every upload (the lease that held them ended); their ids."""
        ids = [hit[1] for hit in list(self._by_id.values())]  # a GC callback may run meanwhile
        self._by_id.clear()
        return ids

    def __len__(self) -> int:
        return len(self._by_id)


class Interrupt:
    """What :func:`deferred_interrupt` yields: ``pressed`` once a Ctrl-C came meanwhile."""

    pressed = False


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[Interrupt | None]:
    """Hold a Ctrl-C back while the body runs (a submit that waits: its answer names the
    job, which the caller then cancels before it raises ``KeyboardInterrupt``); a second
    Ctrl-C raises at once. Yields None, holding nothing, off the main thread or when the
    program has its own SIGINT handler: the caller then runs the body on a helper thread
    (a thread hop per submit that this saves)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield None
        return
    held = Interrupt()

    def hold(signum: int, frame: Any) -> None:
        if held.pressed:
            raise KeyboardInterrupt
        held.pressed = True

    signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class Keeper:
    """Queued releases and the lease heartbeat of one session, on a daemon thread.

    ``release(kind, id)`` sends one release (``kind`` is ``"jobs"`` or ``"tensors"``);
    ``renew()`` renews the lease and returns False when the scheduler no longer knows it.
    Both are called on the keeper's thread only, or from :meth:`flush` by the caller."""

    def __init__(self, release: Callable[[str, str], None], renew: Callable[[], None],
                 *, batch_s: float = 0.2) -> None:
        self._release, self._renew = release, renew
        self.batch_s = batch_s
        self.renew_every_s: float | None = None  # set once a lease is open
        self._queue: collections.deque[tuple[str, str, float]] = collections.deque()  # kind, id, queued at
        # how long a release waits for a submit to carry it (``take``) before the thread sends
        # it itself (0: at once; the remote session sets it while its scheduler takes them)
        self.carry_s = 0.0
        self._wake = threading.Event()
        self._stop = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # one sender at a time (the thread, or flush)
        self._thread: threading.Thread | None = None
        self.sent = 0

    def queue(self, kind: str, ident: str) -> None:
        """Release ``ident`` soon. Safe from a finalizer or a weakref callback (no I/O)."""
        self._queue.append((kind, ident, time.monotonic()))
        self._start()

    def pending(self) -> int:
        return len(self._queue)

    def take(self, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` queued releases, (kind, id) each, off the queue: a submit carries
        them (``release`` of ``POST /v1/jobs``: job and upload ids) instead of a request
        each. :meth:`put_back` returns them if that submit fails."""
        taken: list[tuple[str, str]] = []
        if not self._lock.acquire(blocking=False):
            return taken  # the thread is sending them: the submit does not wait for it
        try:
            while self._queue and len(taken) < limit:
                kind, ident, _ = self._queue.popleft()
                taken.append((kind, ident))
        finally:
            self._lock.release()
        return taken

    def put_back(self, items: Sequence[tuple[str, str]]) -> None:
        """Queue again releases :meth:`take` took (their submit did not arrive)."""
        for kind, ident in items:
            self.queue(kind, ident)

    def flush(self, *, give_up_on_error: bool = False, due: bool = False) -> bool:
        """Send every queued release now (``disconnect`` and tests). With
        ``give_up_on_error``, the first failure drops the rest (an unreachable scheduler is
        not retried once per value at exit; the lease frees them). ``due`` (the thread):
        releases queued less than ``carry_s`` ago stay for a submit to carry; whether any
        stayed."""
        kept: list[tuple[str, str, float]] = []
        with self._lock:
            since = time.monotonic() - self.carry_s
            while self._queue:
                kind, ident, at = item = self._queue.popleft()
                if due and self.carry_s and at > since:
                    kept.append(item)
                    continue
                try:
                    self._release(kind, ident)
                    self.sent += 1
                except Exception as e:  # the lease frees it anyway
                    log.debug("releasing %s/%s failed: %s", kind, ident, e)
                    if give_up_on_error:
                        self._queue.clear()
            self._queue.extendleft(reversed(kept))
        return bool(kept)

    def drop(self) -> None:
        """Forget the queued releases (ending the lease releases them all at once)."""
        self._queue.clear()

    def heartbeat(self, every_s: float) -> None:
        self.renew_every_s = every_s
        self._start()

    def close(self) -> None:
        self._stop = True
        self._stopping.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)

    def _start(self) -> None:
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._run, name="triplane-keeper", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        renewed = time.monotonic()
        waiting = False  # job releases wait for a submit to carry them
        while not self._stop:
            every = self.renew_every_s
            timeout = min(every or self.carry_s, self.carry_s) if waiting else every
            self._wake.wait(timeout=timeout if timeout else None)
            self._wake.clear()
            if self._stop:
                break
            if self._stopping.wait(self.batch_s):  # let a burst of finalizers queue up: one batch
                break
            waiting = self.flush(due=True)
            if every and time.monotonic() - renewed >= every * 0.9:
                try:
                    self._renew()
                except Exception as e:
                    log.debug("renewing the session lease failed: %s", e)
                renewed = time.monotonic()


class ProgressBar:
    """``update(done, total)`` while a job runs; shown only after ``DELAY_S`` on a TTY."""

    def __init__(self, job: str, start: float | None = None) -> None:
        self.job = job
        self.start = time.monotonic() if start is None else start  # the job's submit
        self._bar: Any = None
        self._task: Any = None

    def update(self, progress: Any) -> None:
        if not isinstance(progress, dict) or not progress_enabled():
            return
        done, total = int(progress.get("done") or 0), int(progress.get("total") or 0)
        if self._bar is None:
            if time.monotonic() - self.start < DELAY_S or total <= 0:
                return
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:  # rich is a dependency of the CLI; without it, no bar
                return
            self._bar = Progress(TextColumn(f"job {self.job}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("tasks {task.fields[rate]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task("run", total=total, rate="")
            self._bar.start()
        elapsed = max(time.monotonic() - self.start, 1e-9)
        self._bar.update(self._task, completed=done, total=total, rate=f"{done / elapsed:.1f}/s")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
