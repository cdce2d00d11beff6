"""Executors of a local cluster share the host's cores for BLAS threads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triplane.launcher.cluster import ClusterConfig, LocalCluster


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(v, raising=False)


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("executors", [1, 2, 64])
def test_cores_are_shared_among_executors(tmp_path: Path, executors: int) -> None:
    env = LocalCluster(tmp_path, ClusterConfig(executors=executors))._blas_env()
    want = str(max(1, (os.cpu_count() or 1) // executors))
    assert env == {"OPENBLAS_NUM_THREADS": want, "OMP_NUM_THREADS": want, "MKL_NUM_THREADS": want}


@pytest.mark.usefixtures("clean_env")
def test_a_thread_count_the_user_set_wins(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, ClusterConfig(executors=2), env={"OMP_NUM_THREADS": "3"})
    assert cluster._blas_env() == {}
