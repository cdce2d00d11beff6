"""How many BLAS threads a grouped task runs with (docs/executor.md, "BLAS threads").

An executor's BLAS libraries start with the threads its environment gives them: a local
cluster gives each of its executors the host's cores divided among them
(``launcher/cluster.py``), so that a job cut over every executor does not oversubscribe
the host. A job the scheduler kept whole (``compiler/layout.py``, ``stays_whole``) is the
opposite case: it judged that spreading it buys nothing, and runs it as one grouped task on
one executor -- which would then leave the host's other cores idle. So a grouped task of at
least ``WIDE_FLOPS`` (by the op table's cost) runs with every core this process may use,
and the executor's own count is put back after it. Smaller tasks never change the count
(the switch costs tens of microseconds). Where threadpoolctl is missing or finds no BLAS,
nothing changes.

The count is process-wide (a BLAS library has one), so a kernel another worker thread runs
meanwhile also sees it; with one kernel worker (the default) there is none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["WIDE_FLOPS", "WideBlas"]

log = logging.getLogger("triplane.executor")

WIDE_FLOPS = 1e8  # a grouped task of at least this many flops runs with every core


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class WideBlas:
    """``wide(flops)``: a context in which BLAS runs with ``threads`` (default every usable
    CPU) when ``flops`` reaches ``min_flops``; otherwise, or with ``threads`` <= 1, a no-op."""

    def __init__(self, threads: int | None = None, min_flops: float = WIDE_FLOPS) -> None:
        self.threads = usable_cpus() if threads is None else threads
        self.min_flops = min_flops
        self._controller: Any = None
        self._lock = threading.Lock()
        self.widened = 0  # tasks run wide, for the stats record

    def _blas(self) -> Any:
        with self._lock:
            if self._controller is None:
                try:
                    from threadpoolctl import ThreadpoolController

                    ctl = ThreadpoolController().select(user_api="blas")
                    self._controller = ctl if ctl.lib_controllers else False
                except Exception as e:  # missing or broken: run with what the environment gave
                    log.info("BLAS threads stay as the environment set them: %s", e)
                    self._controller = False
            return self._controller

    @contextlib.contextmanager
    def wide(self, flops: float) -> Iterator[None]:
        blas = self._blas() if self.threads > 1 and flops >= self.min_flops else False
        if not blas or all(c.num_threads >= self.threads for c in blas.lib_controllers):
            yield
            return
        with blas.limit(limits=self.threads):
            self.widened += 1
            yield
