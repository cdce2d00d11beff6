"""A local cluster for the SDK tests (Go, JavaScript, and the cross-language check),
started with the cluster tests' bounded helper (tests/integration/cluster/cluster_run.py),
and the Go toolchain they build with."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from cluster_run import running_cluster

from triplane.launcher import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("sdk"), bound_s=420.0, executors=2) as c:
        yield c


@pytest.fixture(scope="session")
def go() -> str:
    """The go tool (the test skips, saying so, where it is not installed; .ci/run installs it)."""
    path = shutil.which("go")
    if path is None:
        pytest.skip("the Go toolchain is not installed (.ci/run installs golang-go)")
    return path
