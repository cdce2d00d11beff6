"""The dashboard in headless Chromium (Debian's ``/usr/bin/chromium`` driven by Playwright,
never a downloaded browser) against a real local cluster (tests/integration/cluster's
bounded ``running_cluster``). Screenshots go to ``$TRIPLANE_DASHBOARD_SHOTS`` when set, else
to a pytest temporary folder (printed at the end of each test that takes them)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from cluster_run import running_cluster

from triplane.engines.memory.persist import PERSIST_ENV
from triplane.launcher import LocalCluster

CHROMIUM = os.environ.get("TRIPLANE_CHROMIUM", "/usr/bin/chromium")


def chromium_or_skip() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e .[dev])")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    return CHROMIUM


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two executors whose memory spills to disk past 256 MiB, with a file persistence
    target (the Storage page's spilled and persisted bytes)."""
    chromium_or_skip()
    home = tmp_path_factory.mktemp("dash")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(PERSIST_ENV, f"file:{home / 'persist'}")
        with running_cluster(home, bound_s=200.0, executors=2,
                             executor_args=["--memory-engine", f"host,file:{home / 'spill'}@64MiB"]) as c:
            yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("TRIPLANE_DASHBOARD_SHOTS")
    d = Path(where) if where else tmp_path_factory.mktemp("dashboard-shots")
    d.mkdir(parents=True, exist_ok=True)
    return d
