"""The JavaScript SDK (sdk/js) against a live local cluster: `node --test` in sdk/js with
TRIPLANE_TEST_URL / TRIPLANE_TEST_TOKEN (and a read-role token for the 403 case) set, so
its live tests run instead of skipping; examples/mlp.mjs trains the digits MLP with a
falling loss; tools/crosscheck.mjs (PLAN's cross-language contract) equals numpy. Skipped,
saying so, where Node is not installed (.ci/run installs it)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
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


def _numpy_reference(a: dict[str, np.ndarray], lr: float, betas: tuple[float, float],
                     eps: float) -> dict[str, np.ndarray]:
    """The MLP's loss and logits, and one Adam step (step 1, zero moments), in float64."""
    x = a["x"].astype(np.float64)
    pre = x @ a["w1"] + a["b1"]
    h = np.maximum(pre, 0.0)
    logits = h @ a["w2"] + a["b2"]
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    n = len(a["y"])
    loss = -np.log(p[np.arange(n), a["y"]]).mean()
    d = p.copy()
    d[np.arange(n), a["y"]] -= 1.0
    d /= n
    dh = (d @ a["w2"].T) * (pre > 0)
    grads = {"w2": h.T @ d, "b2": d.sum(axis=0), "w1": x.T @ dh, "b1": dh.sum(axis=0)}
    out: dict[str, np.ndarray] = {"loss": np.array(loss), "logits": logits}
    for k, g in grads.items():
        m_hat = (1 - betas[0]) * g / (1 - betas[0])
        v_hat = (1 - betas[1]) * g * g / (1 - betas[1])
        out[k] = a[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return out


def test_crosscheck_program_matches_numpy(cluster: LocalCluster, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    arrays = {"x": rng.standard_normal((64, 64)).astype(np.float32),
              "y": rng.integers(0, 10, 64).astype(np.int64),
              "w1": (rng.standard_normal((64, 32)) * 0.1).astype(np.float32),
              "b1": (rng.standard_normal(32) * 0.1).astype(np.float32),
              "w2": (rng.standard_normal((32, 10)) * 0.1).astype(np.float32),
              "b2": (rng.standard_normal(10) * 0.1).astype(np.float32)}
    spec = {"inputs": {}, "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
    for name, arr in arrays.items():
        arr.tofile(tmp_path / f"{name}.bin")
        spec["inputs"][name] = {"shape": list(arr.shape), "dtype": str(arr.dtype), "file": f"{name}.bin"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = _env(cluster, TRIPLANE_URL=cluster.url, TRIPLANE_TOKEN=cluster.token)
    proc = subprocess.run([NODE, str(SDK / "tools" / "crosscheck.mjs"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    got = json.loads(lines[0])
    want = _numpy_reference(arrays, 0.01, (0.9, 0.999), 1e-8)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(got["logits"]).reshape(64, 10), want["logits"], rtol=1e-5, atol=1e-5)
    for name in ("w1", "b1", "w2", "b2"):
        np.testing.assert_allclose(np.array(got[name]).reshape(arrays[name].shape), want[name], atol=1e-5,
                                   err_msg=name)
