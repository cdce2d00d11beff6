"""Real local clusters for the cluster tests: a scheduler and executor processes on loopback.

Every cluster is started through :class:`triplane.launcher.LocalCluster` in a temporary run
directory and is always stopped (SIGTERM, then SIGKILL) when its test or module ends,
failed or not. A watchdog bounds each one: at ``bound_s`` it stops the cluster, which turns
any wait on it into a prompt error; if the test is still stuck 30 s later the watchdog
kills the processes again and ends the test process, so nothing can hang CI.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_run import running_cluster

from triplane.launcher import LocalCluster
from triplane.sdk.remote import RemoteSession


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
