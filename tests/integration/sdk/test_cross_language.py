"""Issue 14's cross-language must-show: on one local cluster, the same MLP forward pass
(logits = relu(x @ w1 + b1) @ w2 + b2, loss = mean cross entropy), the gradients of the
loss with respect to w1 b1 w2 b2, and one Adam step (step 1, zero moments) run from
Python (``tp.connect`` + ``tp.grad``), Go (``sdk/go/cmd/crosscheck``) and JavaScript
(``sdk/js/tools/crosscheck.mjs``), and each matches numpy.

Tolerances (the cluster computes in float32; numpy here in float64 from the same float32
inputs): loss and logits rtol 1e-4, atol 1e-5; updated parameters rtol 1e-4, atol 1e-6
(an Adam step moves each by at most lr = 0.01, so this checks every update to 1e-4 of it).
The programs follow PLAN's contract: ``<prog> DIR`` with TRIPLANE_URL/TRIPLANE_TOKEN set,
DIR/spec.json naming raw little-endian inputs, one line of JSON on stdout."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sdk_tools import GO_SDK, ROOT, go_env

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.sdk.nn import functional as F

LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
FORWARD_TOL = {"rtol": 1e-4, "atol": 1e-5}
PARAM_TOL = {"rtol": 1e-4, "atol": 1e-6}
PARAMS = ("w1", "b1", "w2", "b2")
JS_CROSSCHECK = ROOT / "sdk" / "js" / "tools" / "crosscheck.mjs"


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(14)
    return {"x": rng.standard_normal((64, 64)).astype(np.float32),
            "y": rng.integers(0, 10, 64).astype(np.int64),
            "w1": (rng.standard_normal((64, 32)) * 0.2).astype(np.float32),
            "b1": (rng.standard_normal(32) * 0.1).astype(np.float32),
            "w2": (rng.standard_normal((32, 10)) * 0.2).astype(np.float32),
            "b2": (rng.standard_normal(10) * 0.1).astype(np.float32)}


def write_spec(path: Path, a: dict[str, np.ndarray]) -> Path:
    spec: dict[str, Any] = {"inputs": {}, "lr": LR, "betas": list(BETAS), "eps": EPS}
    for k, v in a.items():
        (path / f"{k}.bin").write_bytes(np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes())
        spec["inputs"][k] = {"shape": list(v.shape), "dtype": str(v.dtype), "file": f"{k}.bin"}
    (path / "spec.json").write_text(json.dumps(spec))
    return path


def numpy_reference(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The forward pass, the gradients by hand, and Adam's first step, in float64."""
    x, y = a["x"].astype(np.float64), a["y"]
    w1, b1, w2, b2 = (a[k].astype(np.float64) for k in PARAMS)
    z = x @ w1 + b1
    h = np.maximum(z, 0)
    logits = h @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y]).mean()
    dlogits = p.copy()
    dlogits[np.arange(n), y] -= 1
    dlogits /= n
    grads = {"w2": h.T @ dlogits, "b2": dlogits.sum(0)}
    dz = (dlogits @ w2.T) * (z > 0)
    grads |= {"w1": x.T @ dz, "b1": dz.sum(0)}
    out = {"loss": np.array(loss), "logits": logits}
    b1_, b2_ = BETAS
    for k in PARAMS:
        g = grads[k]
        m, v = (1 - b1_) * g, (1 - b2_) * g * g
        out[k] = a[k] - LR * (m / (1 - b1_)) / (np.sqrt(v / (1 - b2_)) + EPS)
    return out


def python_run(c: LocalCluster, a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tp.connect(c.url, c.token)
    try:
        x, y, w1, b1, w2, b2 = (tp.Tensor.from_array(a[k]) for k in ("x", "y", *PARAMS))
        logits = tp.relu(x @ w1 + b1) @ w2 + b2
        loss = F.cross_entropy(logits, y)
        grads = tp.grad(loss, [w1, b1, w2, b2])
        out = {"loss": loss.numpy(), "logits": logits.numpy()}
        b1_, b2_ = BETAS
        for k, w, g in zip(PARAMS, (w1, b1, w2, b2), grads):
            m, v = g * (1 - b1_), g * g * (1 - b2_)
            out[k] = (w - (m / (1 - b1_)) / (tp.sqrt(v / (1 - b2_)) + EPS) * LR).numpy()
        return out
    finally:
        tp.disconnect()


def program_run(argv: list[str], c: LocalCluster, spec_dir: Path, cwd: Path) -> dict[str, np.ndarray]:
    env = go_env(spec_dir, TRIPLANE_URL=c.url, TRIPLANE_TOKEN=c.token or "")
    r = subprocess.run([*argv, str(spec_dir)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{argv}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, f"{argv} printed {len(lines)} lines, the contract is one: {r.stdout!r}"
    doc = json.loads(lines[0])
    assert set(doc) == {"loss", "logits", *PARAMS}, sorted(doc)
    return {k: np.asarray(v, dtype=np.float64) for k, v in doc.items()}


def go_run(c: LocalCluster, spec_dir: Path) -> dict[str, np.ndarray]:
    go = shutil.which("go")
    if go is None:
        pytest.skip("the Go toolchain is not installed (.ci/run installs golang-go)")
    binary = spec_dir / "crosscheck-go"
    build = subprocess.run([go, "build", "-o", str(binary), "./cmd/crosscheck"], cwd=GO_SDK,
                           env=go_env(spec_dir), capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    return program_run([str(binary)], c, spec_dir, GO_SDK)


def js_run(c: LocalCluster, spec_dir: Path) -> dict[str, np.ndarray]:
    if not JS_CROSSCHECK.exists():
        pytest.skip(f"{JS_CROSSCHECK.relative_to(ROOT)} is absent "
                    "(the JS SDK is on branch s4-js until merged)")
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (.ci/run installs nodejs)")
    return program_run([node, str(JS_CROSSCHECK)], c, spec_dir, ROOT)


RUNS: dict[str, Callable[[LocalCluster, Path], dict[str, np.ndarray]]] = {
    "go": go_run, "js": js_run,
}


def check(name: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray],
          a: dict[str, np.ndarray]) -> None:
    np.testing.assert_allclose(np.asarray(got["loss"]).reshape(()), want["loss"], **FORWARD_TOL,
                               err_msg=f"{name}: loss")
    np.testing.assert_allclose(np.asarray(got["logits"]).reshape(want["logits"].shape), want["logits"],
                               **FORWARD_TOL, err_msg=f"{name}: logits")
    for k in PARAMS:
        g = np.asarray(got[k]).reshape(a[k].shape)
        np.testing.assert_allclose(g, want[k], **PARAM_TOL, err_msg=f"{name}: updated {k}")
        assert not np.allclose(g, a[k]), f"{name}: {k} did not move"


def test_python_matches_numpy(cluster: LocalCluster) -> None:
    a = arrays()
    check("python", python_run(cluster, a), numpy_reference(a), a)


@pytest.mark.parametrize("language", sorted(RUNS))
def test_sdk_crosscheck_matches_numpy_and_python(language: str, cluster: LocalCluster,
                                                 tmp_path: Path) -> None:
    a = arrays()
    spec_dir = write_spec(tmp_path, a)
    got = RUNS[language](cluster, spec_dir)
    check(language, got, numpy_reference(a), a)
    # and the same numbers as the Python SDK's run, to the same tolerances
    py = python_run(cluster, a)
    check(f"{language} vs python", got, {k: np.asarray(v, np.float64) for k, v in py.items()}, a)
