"""Issue 13's must-show on a real local cluster: a graph with no shapes or dtypes anywhere
(inputs typed by their uploads) and a gradient request, posted with plain ``curl``,
computes what the Python SDK's run of the same model computes (``tp.connect`` and
``tp.grad``), within float32 rounding (rtol 1e-5, atol 1e-6); a wrong shape in it is a 400
naming the node and the loc the client attached (proto/infer.py, proto/autograd.py). A
gradient is a ref like any fetched name: an SGD step reads ``<job>:grad:w1`` untyped."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster_run import running_cluster

import triplane as tp
from triplane.launcher import LocalCluster

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("wiregrad"), bound_s=240.0, executors=2) as c:
        yield c


def curl(c: LocalCluster, *args: str) -> tuple[int, bytes]:
    """(HTTP status, body) of ``curl`` with the cluster's token."""
    r = subprocess.run(["curl", "-sS", "--max-time", "90", "-H", f"Authorization: Bearer {c.token}",
                        "-w", "\n%{http_code}", *args], capture_output=True, timeout=120, check=True)
    body, _, code = r.stdout.rpartition(b"\n")
    return int(code), body


def upload(c: LocalCluster, tmp: Path, name: str, a: np.ndarray) -> str:
    path = tmp / f"{name}.bin"
    path.write_bytes(a.tobytes())
    code, body = curl(c, "-X", "POST", "--data-binary", f"@{path}",
                      "-H", f"X-Triplane-Shape: {','.join(map(str, a.shape))}",
                      "-H", f"X-Triplane-Dtype: {a.dtype}", f"{c.url}/v1/tensors")
    assert code == 201, body
    return json.loads(body)["id"]


def model(ids: dict[str, str]) -> dict[str, Any]:
    """h = tanh(x @ w1 + b1); loss = mean((h @ w2 - t)^2), no shapes, each node at a 'line'."""
    nodes: dict[str, Any] = {k: {"op": "input", "attrs": {"tensor": u}, "loc": f"train.go:{i + 1}"}
                             for i, (k, u) in enumerate(ids.items())}
    ops = [("xw", "matmul", ["x", "w1"]), ("z", "add", ["xw", "b1"]), ("h", "tanh", ["z"]),
           ("out", "matmul", ["h", "w2"]), ("d", "sub", ["out", "t"]), ("sq", "mul", ["d", "d"]),
           ("loss", "mean", ["sq"])]
    for i, (nid, op, inputs) in enumerate(ops):
        nodes[nid] = {"op": op, "inputs": inputs, "loc": f"train.go:{10 + i}"}
    return {"graph": {"version": 1, "nodes": nodes, "outputs": ["loss"]},
            "grad": {"of": "loss", "wrt": ["w1", "b1", "w2"]}}


def post_job(c: LocalCluster, tmp: Path, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    path = tmp / "job.json"
    path.write_text(json.dumps(doc))
    code, body = curl(c, "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", f"@{path}",
                      f"{c.url}/v1/jobs")
    return code, json.loads(body)


def fetch(c: LocalCluster, job: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
    code, body = curl(c, f"{c.url}/v1/jobs/{job}/tensors/{name}")
    assert code == 200, body
    return np.frombuffer(body, np.float32).reshape(shape)


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(13)
    shapes = {"x": (16, 5), "w1": (5, 7), "b1": (7,), "w2": (7, 3), "t": (16, 3)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def sdk_run(c: LocalCluster, a: dict[str, np.ndarray]) -> list[np.ndarray]:
    tp.connect(c.url, c.token)
    try:
        x, w1, b1, w2, t = (tp.Tensor.from_array(a[k]) for k in ("x", "w1", "b1", "w2", "t"))
        d = tp.tanh(x @ w1 + b1) @ w2 - t
        loss = (d * d).mean()
        grads = tp.grad(loss, [w1, b1, w2])
        return [loss.numpy(), *(g.numpy() for g in grads)]
    finally:
        tp.disconnect()


def test_a_shapeless_graph_with_a_grad_request_by_curl_equals_the_sdk_run(cluster: LocalCluster,
                                                                            tmp_path: Path) -> None:
    a = arrays()
    ids = {k: upload(cluster, tmp_path, k, v) for k, v in a.items()}
    code, job = post_job(cluster, tmp_path, model(ids))
    assert code == 201, job
    code, body = curl(cluster, f"{cluster.url}/v1/jobs/{job['id']}/wait?timeout=60")
    assert code == 200 and json.loads(body)["state"] == "done", body
    got = [fetch(cluster, job["id"], n, a[w].shape if w else ())
           for n, w in [("loss", ""), ("grad:w1", "w1"), ("grad:b1", "b1"), ("grad:w2", "w2")]]
    want = sdk_run(cluster, a)
    for name, g, w in zip(["loss", "grad:w1", "grad:b1", "grad:w2"], got, want):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=name)
    # and both equal numpy's own derivation
    h = np.tanh(a["x"] @ a["w1"] + a["b1"])
    d = h @ a["w2"] - a["t"]
    np.testing.assert_allclose(got[3], h.T @ (2 * d / d.size), rtol=1e-4, atol=1e-6)
    # an SGD step reading the weight and its gradient by ref (<job>:grad:w1), no shapes either
    step = {"graph": {"nodes": {
        "w": {"op": "input", "attrs": {"tensor": ids["w1"]}},
        "g": {"op": "input", "attrs": {"tensor": f"{job['id']}:grad:w1"}},
        "lr": {"op": "full", "attrs": {"value": 0.5, "shape": []}},
        "dw": {"op": "mul", "inputs": ["lr", "g"]}, "w2": {"op": "sub", "inputs": ["w", "dw"]}},
        "outputs": ["w2"]}, "wait_s": 30}
    code, body = post_job(cluster, tmp_path, step)
    assert code == 201 and body["state"] == "done", body
    np.testing.assert_allclose(fetch(cluster, body["id"], "w2", a["w1"].shape), a["w1"] - 0.5 * got[1],
                               rtol=1e-6, atol=1e-7)


def test_a_wrong_shape_by_curl_is_400_naming_the_node_and_the_loc(cluster: LocalCluster,
                                                                 tmp_path: Path) -> None:
    a = arrays()
    a["w2"] = np.zeros((6, 3), np.float32)  # h is (16, 7)
    ids = {k: upload(cluster, tmp_path, k, v) for k, v in a.items()}
    code, body = post_job(cluster, tmp_path, model(ids))
    assert code == 400, body
    err = body["error"]
    assert (err["kind"], err["node"], err["op"]) == ("shape", "out", "matmul")
    assert "(at train.go:13)" in err["message"]
    assert "float32[16, 7], float32[6, 3]" in err["message"]
