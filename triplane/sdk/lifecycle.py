"""What a cluster session keeps alive, and for how long (docs/cluster.md, "Lifecycle").

* :class:`Keeper` -- one daemon thread per :class:`~triplane.sdk.remote.RemoteSession`. It
  sends the releases that finalizers and ``evaluate`` queue (``DELETE /v1/jobs/{id}``,
  ``DELETE /v1/tensors/{id}``; a finalizer only appends to a queue, never does I/O) in
  batches, and renews the client session lease every third of its TTL so that the
  scheduler knows the client is alive. Best effort: a release that fails is logged at
  debug level and left to the lease (the scheduler frees what an ended session held).
* :class:`ProgressBar` -- a ``rich`` progress bar for a job that takes longer than
  ``DELAY_S``, on a terminal only (stderr a TTY), off with :func:`set_progress`.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["DELAY_S", "Keeper", "ProgressBar", "progress_enabled", "set_progress"]

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
        self._queue: collections.deque[tuple[str, str]] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._lock = threading.Lock()  # one sender at a time (the thread, or flush)
        self._thread: threading.Thread | None = None
        self.sent = 0

    def queue(self, kind: str, ident: str) -> None:
        """Release ``ident`` soon. Safe from a finalizer or a weakref callback (no I/O)."""
        self._queue.append((kind, ident))
        self._start()

    def pending(self) -> int:
        return len(self._queue)

    def flush(self) -> None:
        """Send every queued release now (``disconnect`` and tests)."""
        with self._lock:
            while self._queue:
                kind, ident = self._queue.popleft()
                try:
                    self._release(kind, ident)
                    self.sent += 1
                except Exception as e:  # the lease frees it anyway
                    log.debug("releasing %s/%s failed: %s", kind, ident, e)

    def heartbeat(self, every_s: float) -> None:
        self.renew_every_s = every_s
        self._start()

    def close(self) -> None:
        self._stop = True
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
        while not self._stop:
            every = self.renew_every_s
            self._wake.wait(timeout=every if every else None)
            self._wake.clear()
            if self._stop:
                break
            time.sleep(self.batch_s)  # let a burst of finalizers queue up: one batch
            self.flush()
            if every and time.monotonic() - renewed >= every * 0.9:
                try:
                    self._renew()
                except Exception as e:
                    log.debug("renewing the session lease failed: %s", e)
                renewed = time.monotonic()


class ProgressBar:
    """``update(done, total)`` while a job runs; shown only after ``DELAY_S`` on a TTY."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.start = time.monotonic()
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
