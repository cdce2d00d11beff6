"""The JavaScript SDK (sdk/js) against a live local cluster: `node --test` in sdk/js with
TRIPLANE_TEST_URL / TRIPLANE_TEST_TOKEN (and a read-role token for the 403 case) set, so
its live tests run instead of skipping; and examples/mlp.mjs trains the digits MLP with a
falling loss. Skipped, saying so, where Node is not installed (.ci/run installs it)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from triplane.launcher import LocalCluster
from triplane.scheduler.api.tokens import add_token

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from cluster_run import running_cluster

REPO = Path(__file__).resolve().parents[3]
SDK = REPO / "sdk" / "js"
NODE = shutil.which("node")


def _node_major() -> int:
    if NODE is None:
        return 0
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True, check=True).stdout
    return int(out.strip().lstrip("v").split(".")[0])


pytestmark = pytest.mark.skipif(_node_major() < 20,
                                reason="Node 20+ is not installed (.ci/run installs nodejs)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("js") / "home", bound_s=300.0) as c:
        yield c


def _env(cluster: LocalCluster, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIPLANE_")}
    return {**env, "TRIPLANE_HOME": str(cluster.run.path), **more}


def test_node_tests_pass_with_the_live_cases_run(cluster: LocalCluster) -> None:
    reader = add_token(cluster.run.tokens_file, "js-reader", "read")
    env = _env(cluster, TRIPLANE_TEST_URL=cluster.url, TRIPLANE_TEST_TOKEN=cluster.token,
               TRIPLANE_TEST_READ_TOKEN=reader)
    proc = subprocess.run([NODE, "--test"], cwd=SDK, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    counts = {k: int(v) for k, v in re.findall(r"^# (pass|fail|skipped|cancelled) (\d+)$", proc.stdout, re.M)}
    assert counts.get("fail") == 0 and counts.get("cancelled") == 0, counts
    assert counts.get("skipped") == 0, f"live cases skipped: {counts}\n{out[-4000:]}"
    assert counts.get("pass", 0) >= 100, counts
    assert "op table coverage: 89/89 ops" in proc.stdout or "missing: none" in proc.stdout, out[-3000:]
    for case in ("an aborted signal cancels the job on the cluster", "a job failing on the cluster",
                 "a refused token", "a token whose role may not submit"):
        assert re.search(rf"^\s*ok \d+ - {re.escape(case)}", proc.stdout, re.M), f"{case!r} did not pass"


def test_mlp_example_trains_with_a_falling_loss(cluster: LocalCluster, tmp_path: Path) -> None:
    data = tmp_path / "digits.json"
    subprocess.run([sys.executable, str(SDK / "examples" / "digits.py"), str(data)], check=True, timeout=120)
    proc = subprocess.run([NODE, str(SDK / "examples" / "mlp.mjs"), str(data), "6"], env=_env(cluster),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(v) for v in re.findall(r"^step \d+ loss ([0-9.]+)$", proc.stdout, re.M)]
    assert len(losses) == 6, proc.stdout
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] - 0.1, losses
