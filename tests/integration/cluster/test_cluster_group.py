"""Tiny jobs as one grouped task on a real local cluster (docs/runtime.md, "Grouped jobs"):
the job is one task whose values equal numpy's, a failing kernel inside it names the
user's node, and the SIGKILL of the executor running it drifts it whole to the other."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from cluster_memory import settled_free
from cluster_rows import task_rows

import triplane as tp
from triplane.executor.tasks import STALL_ENV
from triplane.proto.errors import KernelError
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session


def test_a_tiny_job_is_one_task_with_numpys_values(start_cluster: Callable[..., Any]) -> None:
    rng = np.random.default_rng(3)
    xa = rng.standard_normal((16, 8)).astype(np.float32)
    wa = rng.standard_normal((8, 4)).astype(np.float32)
    with start_cluster(bound_s=90, executors=2) as cluster:
        h = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                         timeout=10)
        before = settled_free(cluster)
        with RemoteSession(cluster.url, cluster.token, job_timeout_s=30.0) as s, use_session(s):
            s.release_values = False  # the test releases the job itself
            x, w = tp.Tensor.from_array(xa), tp.Tensor.from_array(wa)
            hidden = tp.tanh(x @ w)
            outs = [hidden.sum(), hidden * 2.0, w - 1.0]
            got = s.evaluate(outs)
            job = s.last_job
            body = h.get(f"/v1/jobs/{job}").json()
            assert body["state"] == "done" and body["progress"] == {"done": 1, "total": 1}, body
            (row,) = task_rows(cluster.db, job)
            assert row.op == "graph" and row.state == "done" and row.attempt == 0
            want = np.tanh(xa @ wa)
            np.testing.assert_allclose(got[0], want.sum(), rtol=1e-5)
            np.testing.assert_allclose(got[1], want * 2.0, rtol=1e-6)
            np.testing.assert_array_equal(got[2], wa - 1.0)
            assert settled_free(cluster) < before  # its output tiles are held on the executor
            assert h.delete(f"/v1/jobs/{job}").status_code == 200
            assert settled_free(cluster, want=before) == before  # every tile of the group went
        h.close()


def test_a_failing_kernel_inside_a_group_names_the_users_node(start_cluster: Callable[..., Any]) -> None:
    with (start_cluster(bound_s=90, executors=2) as cluster,
          RemoteSession(cluster.url, cluster.token, job_timeout_s=30.0) as s, use_session(s)):
        x = tp.Tensor.from_array(np.array([1.0, 2.0, 3.0], np.float32))
        idx = tp.Tensor.from_array(np.array([0, 7]))
        bad = tp.gather(x * 2.0, idx, axis=0)  # 7 is out of range: only the kernel can tell
        with pytest.raises(KernelError) as info:
            (bad + 1.0).numpy()
        assert info.value.op == "gather" and "out of range" in str(info.value)
        assert f"{__file__}:" in str(info.value)  # the SDK maps the node back to this line
        job = s.last_job
        h = {"Authorization": f"Bearer {cluster.token}"}
        body = httpx.get(f"{cluster.url}/v1/jobs/{job}", headers=h, timeout=10).json()
        assert body["progress"]["total"] == 1
        err = body["error"]
        assert err["kind"] == "user" and err["op"] == "gather" and err["node"] != "g", err


@pytest.mark.slow
def test_the_executor_running_a_group_sigkilled_drifts_it_whole(
        start_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # First attempts of a group holding a matmul stall 30 s on the executor (fault injection),
    # so the kill lands mid-run; the second attempt runs at once on the other executor.
    monkeypatch.setenv(STALL_ENV, "matmul:30")
    rng = np.random.default_rng(5)
    xa = rng.standard_normal((128, 128)).astype(np.float32)  # 64 KiB: runs in the kernel pool
    with start_cluster(bound_s=120, executors=2) as cluster:
        headers = {"Authorization": f"Bearer {cluster.token}"}
        s = RemoteSession(cluster.url, cluster.token, job_timeout_s=60.0, reconnect_s=20.0, poll_s=0.2)
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                with use_session(s):
                    x = tp.Tensor.from_array(xa)
                    result["got"] = s.evaluate([(-(x @ x)).sum(), tp.exp(-x)])
            except BaseException as e:
                result["error"] = e

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        victim = None
        deadline = time.monotonic() + 30
        while victim is None and time.monotonic() < deadline:
            nodes = httpx.get(f"{cluster.url}/v1/nodes", headers=headers, timeout=5).json()["items"]
            busy = [n for n in nodes if n["running"]]
            if busy:
                victim = next(p for p in cluster.executors if p.pid == busy[0]["pid"])
            time.sleep(0.05)
        assert victim is not None, "no executor ever ran the group"
        os.kill(victim.pid, signal.SIGKILL)
        worker.join(60)
        assert not worker.is_alive() and "error" not in result, result.get("error")
        np.testing.assert_allclose(result["got"][0], -(xa @ xa).sum(), rtol=1e-4)
        np.testing.assert_allclose(result["got"][1], np.exp(-xa), rtol=1e-6)
        (row,) = task_rows(cluster.db, s.last_job)
        assert row.op == "graph" and row.state == "done" and row.attempt >= 1 and row.node != victim.name
        s.close()


def test_a_job_over_4_mib_quick_on_one_node_runs_uncut_and_resumes_so_after_a_restart(
        start_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # 8.5 MiB of tensors and milliseconds of compute: kept whole for a cluster of 1 GiB
    # executors (compiler/layout.py, stays_whole), so one grouped task. Its first attempt
    # stalls (fault injection) and the scheduler is killed meanwhile: the restarted one
    # compiles the stored job again as the same one task (its job.bindings say "whole").
    monkeypatch.setenv(STALL_ENV, "matmul:4")
    rng = np.random.default_rng(7)
    xa = rng.standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    wa = (rng.standard_normal((1024, 64)) * 0.05).astype(np.float32)
    with start_cluster(bound_s=120, executors=2) as cluster:
        headers = {"Authorization": f"Bearer {cluster.token}"}

        def given(h: httpx.Client, arr: np.ndarray) -> dict[str, Any]:
            r = h.post("/v1/tensors", content=arr.tobytes(), headers={
                "X-Triplane-Shape": ",".join(map(str, arr.shape)), "X-Triplane-Dtype": "float32"})
            assert r.status_code == 201, r.text
            shape = list(arr.shape)
            return {"op": "input", "shape": shape, "dtype": "float32",
                    "attrs": {"tensor": r.json()["id"], "shape": shape, "dtype": "float32"}}

        with httpx.Client(base_url=cluster.url, headers=headers, timeout=20) as h:
            nodes = {"x": given(h, xa), "w": given(h, wa),
                     "t": {"op": "tanh", "inputs": ["x"], "shape": [1024, 1024], "dtype": "float32"},
                     "m": {"op": "matmul", "inputs": ["t", "w"], "shape": [1024, 64], "dtype": "float32"}}
            r = h.post("/v1/jobs", json={"graph": {"version": 1, "nodes": nodes, "outputs": ["m"]},
                                         "fetch": ["m"]})
            assert r.status_code == 201, r.text
            job = r.json()["id"]
            time.sleep(1.0)  # stored, and the group's first attempt stalls on an executor
            cluster.restart_scheduler(kill=True)
        with httpx.Client(base_url=cluster.url, headers=headers, timeout=20) as h:
            body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 60}).json()
            assert body["state"] == "done" and body["progress"] == {"done": 1, "total": 1}, body
            got = h.get(f"/v1/jobs/{job}/tensors/m")
            assert got.status_code == 200, got.text
            np.testing.assert_allclose(np.frombuffer(got.content, np.float32).reshape(1024, 64),
                                       np.tanh(xa) @ wa, rtol=1e-4, atol=1e-4)
        (row,) = task_rows(cluster.db, job)
        assert row.op == "graph" and row.state == "done"
