"""Start-up shared by the long-running processes (scheduler, executor)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Coroutine
from typing import Any


def prepare_process() -> None:
    """Tune the garbage collector for a service: a job of 10,000 tasks allocates ~10^6
    small objects while it is planned, and every task a few hundred more; the default
    thresholds would scan the heap thousands of times a second (15-30% of a submit).
    Objects alive at start-up are frozen: they never need scanning again."""
    from triplane.engines.registry import load_op_plugins

    # User ops of installed packages (entry points ``triplane.ops``) join the op table of the
    # scheduler and the executors alike; a plugin that fails is left out and logged.
    for problem in load_op_plugins():
        logging.getLogger(__name__).error("plugin isolated: %s", problem)
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def event_loop_runner() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """``uvloop.run`` where installed (a faster loop for the packet path), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run
