"""Start-up shared by the long-running processes (scheduler, executor)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def prepare_process() -> None:
    """Tune the garbage collector for a service: a job of 10,000 tasks allocates ~10^6
    small objects while it is planned, and every task a few hundred more; the default
    thresholds would scan the heap thousands of times a second (15-30% of a submit).
    Objects alive at start-up are frozen: they never need scanning again. glibc's malloc
    gets at most :data:`MALLOC_ARENAS` arenas (``limit_malloc_arenas``)."""
    from triplane.engines.registry import load_op_plugins

    limit_malloc_arenas()

    # User ops of installed packages (entry points ``triplane.ops``) join the op table of the
    # scheduler and the executors alike; a plugin that fails is left out and logged.
    for problem in load_op_plugins():
        logging.getLogger(__name__).error("plugin isolated: %s", problem)
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``) unless ``MALLOC_ARENA_MAX`` is
    set; whether it did. By default every thread that allocates may get its own arena (up
    to 8 per core), and the journal writer and the worker threads each grow one that is
    rarely given back: 5,000 small jobs grew the scheduler's RSS by 11% with them and 6-7%
    with two (``tests/unit/scheduler/test_sched_memory.py``). Elsewhere (musl, macOS) a no-op."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    m_arena_max = -8  # <malloc.h>
    try:
        return bool(ctypes.CDLL(None).mallopt(m_arena_max, arenas))
    except (OSError, AttributeError):
        return False


def event_loop_runner() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """``uvloop.run`` where installed (a faster loop for the packet path), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run
