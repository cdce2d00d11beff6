"""A real local cluster for a test or a module: started through
:class:`triplane.launcher.LocalCluster` in a temporary run directory, always stopped, and
bounded by a watchdog (see conftest.py, whose fixtures use it)."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from triplane.launcher import ClusterConfig, LocalCluster


def _needs() -> str | None:
    for mod in ("fastapi", "uvicorn", "httpx"):
        try:
            __import__(mod)
        except ImportError:
            return f"the cluster extra is not installed ({mod} missing)"
    return None


@contextlib.contextmanager
def running_cluster(home: Path, bound_s: float = 120.0, **config: object) -> Iterator[LocalCluster]:
    """A started cluster (``config`` goes to ClusterConfig), stopped on exit and at ``bound_s``."""
    reason = _needs()
    if reason:
        pytest.skip(reason)
    cluster = LocalCluster(home, ClusterConfig(**{"memory": "256MiB", "ready_timeout_s": 60.0,
                                                  **config}))  # type: ignore[arg-type]

    def expire() -> None:
        print(f"\n[watchdog] cluster in {home} exceeded {bound_s:g} s: stopping it", file=sys.stderr)
        cluster.stop(grace_s=1.0)

    def last_resort() -> None:
        cluster.stop(grace_s=0.0)
        faulthandler.dump_traceback(sys.stderr)
        os._exit(70)

    soft = threading.Timer(bound_s, expire)
    hard = threading.Timer(bound_s + 30.0, last_resort)
    for t in (soft, hard):
        t.daemon = True
        t.start()
    try:
        cluster.start()
        yield cluster
    finally:
        soft.cancel()
        hard.cancel()
        cluster.stop(grace_s=3.0)
        cluster.run.clear_cluster()
