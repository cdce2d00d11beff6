"""Real local clusters for the cluster tests: a scheduler and executor processes on loopback.

Every cluster is started through :class:`triplane.launcher.LocalCluster` in a temporary run
directory and is always stopped (SIGTERM, then SIGKILL) when its test or module ends,
failed or not. A watchdog bounds each one: at ``bound_s`` it stops the cluster, which turns
any wait on it into a prompt error; if the test is still stuck 30 s later the watchdog
kills the processes again and ends the test process, so nothing can hang CI.
"""

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
from triplane.sdk.remote import RemoteSession


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


@pytest.fixture
def start_cluster(tmp_path: Path) -> object:
    """``with start_cluster(bound_s=..., executors=...) as c:`` — a cluster for one test."""

    def start(bound_s: float = 120.0, **config: object) -> contextlib.AbstractContextManager[LocalCluster]:
        return running_cluster(tmp_path / "home", bound_s, **config)

    return start


@pytest.fixture(scope="module")
def remote(cluster: LocalCluster) -> Iterator[RemoteSession]:
    """A session on the module's cluster (bounded job waits)."""
    s = RemoteSession(cluster.url, cluster.token, job_timeout_s=60.0, reconnect_s=20.0, poll_s=2.0)
    yield s
    s.close()


@pytest.fixture(scope="module", params=[2, 3], ids=["2-executors", "3-executors"])
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A module-wide cluster of 2, then of 3, executor processes."""
    home = tmp_path_factory.mktemp(f"cluster{request.param}")
    with running_cluster(home, bound_s=240.0, executors=request.param) as c:
        yield c
