"""The admin routes on a real local cluster of two executors (docs/api.md): a drained node
gets no task of a new job (its tasks page names the other node only), a job queued while
every node is drained waits, is cancelled with POST .../cancel and retried once a node is
back -- the retry computes what numpy does -- and the job's tiles page says where its
result lives."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
from cluster_run import running_cluster


def _upload(h: httpx.Client, a: np.ndarray) -> str:
    r = h.post("/v1/tensors", content=a.tobytes(), headers={
        "X-Triplane-Shape": ",".join(map(str, a.shape)), "X-Triplane-Dtype": str(a.dtype)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _graph(u: str, n: int) -> dict:
    """``n`` independent exp tasks of one input, each fetched (``y0`` .. ``y{n-1}``)."""
    nodes: dict[str, dict] = {"x": {"op": "input", "shape": [64, 64], "dtype": "float32",
                                    "attrs": {"tensor": u, "shape": [64, 64], "dtype": "float32"}}}
    for i in range(n):
        nodes[f"y{i}"] = {"op": "exp", "inputs": ["x"], "shape": [64, 64], "dtype": "float32"}
    return {"version": 1, "nodes": nodes, "outputs": list(nodes)[1:]}


def _all(h: httpx.Client, path: str) -> list[dict]:
    items, cursor = [], None
    while True:
        body = h.get(path, params={"limit": 7, **({"cursor": cursor} if cursor else {})}).json()
        items += body["items"]
        cursor = body["next"]
        if cursor is None:
            return items


def _wait(h: httpx.Client, job: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 5}).json()
        if body["state"] not in ("queued", "running") or time.monotonic() > deadline:
            return body


def test_drain_cancel_retry_tasks_and_tiles_on_a_live_cluster(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "home", bound_s=180.0, executors=2) as c, \
            httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.token}"}, timeout=30.0) as h:
        nodes = [n["node"] for n in h.get("/v1/nodes").json()["items"]]
        assert len(nodes) == 2
        drained, other = nodes
        assert h.post(f"/v1/nodes/{drained}/drain").json()["drained"] is True
        x = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
        u = _upload(h, x)
        fetch = [f"y{i}" for i in range(12)]
        r = h.post("/v1/jobs", json={"graph": _graph(u, 12), "fetch": fetch, "name": "drained", "wait_s": 30})
        assert r.status_code == 201 and r.json()["state"] == "done", r.text
        job = r.json()["id"]
        time.sleep(0.6)  # task rows are written in batches every 0.2 s
        tasks = _all(h, f"/v1/jobs/{job}/tasks")
        assert tasks and {t["node"] for t in tasks} == {other}, tasks  # nothing went to the drained node
        assert all(t["state"] == "done" and t["actual_s"] is not None for t in tasks)

        # every node drained: a new job waits; cancel it, undrain, retry it
        assert h.post(f"/v1/nodes/{other}/drain").json()["drained"] is True
        r = h.post("/v1/jobs", json={"graph": _graph(u, 3), "fetch": ["y0", "y1", "y2"], "tags": ["again"]})
        stuck = r.json()["id"]
        time.sleep(1.0)
        assert h.get(f"/v1/jobs/{stuck}").json()["progress"]["done"] == 0
        assert h.post(f"/v1/jobs/{stuck}/cancel").json()["state"] == "cancelled"
        assert h.post(f"/v1/nodes/{other}/undrain").json()["drained"] is False
        r = h.post(f"/v1/jobs/{stuck}/retry")
        assert r.status_code == 201, r.text
        again = r.json()["id"]
        assert r.json()["retry_of"] == stuck and _wait(h, again)["state"] == "done"
        body = h.get(f"/v1/jobs/{again}").json()
        assert body["tags"] == ["again"] and body["progress"]["done"] == body["progress"]["total"] > 0
        got = np.frombuffer(h.get(f"/v1/jobs/{again}/tensors/y1").content, np.float32).reshape(64, 64)
        np.testing.assert_allclose(got, np.exp(x), rtol=1e-6)
        listed = [j["id"] for j in _all(h, "/v1/jobs")]
        assert listed[:3] == [again, stuck, job]
        time.sleep(0.6)
        tiles = _all(h, f"/v1/jobs/{again}/tiles")
        assert {t["tensor"] for t in tiles} == {"y0", "y1", "y2"}, tiles  # the fetched names
        assert all(t["node"] == other for t in tiles), tiles
        assert all(t["nbytes"] == 64 * 64 * 4 for t in tiles if t["tensor"] == "y1")
        assert h.post(f"/v1/nodes/{drained}/undrain").json()["drained"] is False
        assert h.get("/v1/config").json()["drained"] == []
