"""A done job's results and plan survive a scheduler restart (real processes on loopback):
the executors keep the tiles, the restarted scheduler finds them through the metadb.

One job fetching a tiled output runs to done; only the scheduler is restarted (SIGKILL);
the tensor is fetched again byte for byte, the plan is the recorded prediction, and after
a DELETE by the new process the tensor is 404."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

ROWS, COLS = 1024, 1024  # 4 MiB of float32: cut into tiles on 8 MiB executors


def graph() -> dict[str, Any]:
    nodes = {"x": {"op": "normal", "shape": [ROWS, COLS], "dtype": "float32",
                   "attrs": {"seed": 11, "shape": [ROWS, COLS], "dtype": "float32"}},
             "y": {"op": "neg", "inputs": ["x"], "shape": [ROWS, COLS], "dtype": "float32"}}
    return {"version": 1, "nodes": nodes, "outputs": ["y"]}


def _wait(c: httpx.Client, job: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        st = c.get(f"/v1/jobs/{job}/wait", params={"timeout": 5}).json()
        if st["state"] not in ("queued", "running") or time.monotonic() > deadline:
            return st


def _nodes_back(c: httpx.Client, n: int, timeout_s: float = 20.0) -> None:
    """Until the restarted scheduler tracks ``n`` executors again (they re-register)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = c.get("/v1/nodes")
        if r.status_code == 200 and len(r.json()["items"]) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"the restarted scheduler lists {c.get('/v1/nodes').text}, want {n} executors")


def test_a_restarted_scheduler_serves_a_done_jobs_tiles_and_recorded_plan(
        start_cluster: Callable[..., Any]) -> None:
    with start_cluster(bound_s=90, executors=2, memory="8MiB") as cluster:
        headers = {"Authorization": f"Bearer {cluster.token}"}
        with httpx.Client(base_url=cluster.url, headers=headers, timeout=20) as c:
            r = c.post("/v1/jobs", json={"graph": graph(), "fetch": ["y"]})
            assert r.status_code == 201, r.text
            job = r.json()["id"]
            assert _wait(c, job)["state"] == "done"
            before = c.get(f"/v1/jobs/{job}/tensors/y")
            assert before.status_code == 200 and len(before.content) == ROWS * COLS * 4
            plan_before = c.get(f"/v1/jobs/{job}/plan").json()
            assert plan_before["tiled"]
            tiles = next(t for t in plan_before["tensors"] if t["tensor"] == "y")["tiles"]
            assert len(tiles) > 1, plan_before["tensors"]
            time.sleep(0.5)  # the journal writes the done rows in batches of 0.2 s

            cluster.restart_scheduler(kill=True)

        with httpx.Client(base_url=cluster.url, headers=headers, timeout=20) as c:
            _nodes_back(c, 2)
            after = c.get(f"/v1/jobs/{job}/tensors/y")
            assert after.status_code == 200, after.text
            assert after.headers["X-Triplane-Shape"] == f"{ROWS},{COLS}"
            assert after.content == before.content

            plan = c.get(f"/v1/jobs/{job}/plan")
            assert plan.status_code == 200, plan.text
            doc = plan.json()
            assert doc["recorded"] is True and doc["job"] == job
            assert doc["makespan"]["predicted_s"] == plan_before["makespan"]["predicted_s"]
            assert [t["task"] for t in doc["tasks"]] == [t["task"] for t in plan_before["tasks"]]
            # ... with the actual kernel times beside the predictions, as the live plan had them
            assert [(t["actual"], t["ratio"]) for t in doc["tasks"]] == \
                [(t["actual"], t["ratio"]) for t in plan_before["tasks"]]
            assert doc["makespan"] == plan_before["makespan"] and doc["makespan"]["actual_s"] is not None

            assert c.delete(f"/v1/jobs/{job}").status_code == 200
            gone = c.get(f"/v1/jobs/{job}/tensors/y")
            assert gone.status_code == 404 and "released" in gone.json()["error"]["message"]
