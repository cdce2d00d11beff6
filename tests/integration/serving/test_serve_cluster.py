"""The model server on a real local cluster (2 executors, 2 replicas): predictions equal
the in-process model's; once loaded, each batch is one compiled-step request (no graph,
no upload); each replica prefers its own executor, so both executors run batches; an
executor SIGKILLed under load fails no request. And ``triplane serve`` as
its own process: ready file, predict, SIGHUP reloads the file, SIGTERM stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.sdk import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from cluster_run import running_cluster

ROOT = Path(__file__).resolve().parents[3]


def _cnn(path: Path, seed: int = 0) -> tp.Model:
    tp.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 10))
    tp.save_model(model, [np.zeros((2, 1, 8, 8), np.float32)], path, names={"inputs": ["image"]})
    return tp.load_model(path)


def tasks_by_node(cluster: LocalCluster) -> Counter[str]:
    """Tasks that succeeded on each executor, from the scheduler's /metrics."""
    text = httpx.get(f"{cluster.url}/metrics", headers={"Authorization": f"Bearer {cluster.token}"}).text
    done: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("triplane_tasks_succeeded_total{") or line.startswith("triplane_tasks_succeeded{"):
            node = line.split('node="', 1)[1].split('"', 1)[0]
            done[node] += int(float(line.split()[-1]))
    return done


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("serve-cluster"), bound_s=420.0, executors=2,
                         log_level="warning") as c:
        yield c


def _counted(s: Any, post: Any, seen: Any) -> Any:
    def counted(path: str, content: bytes, *a: Any, **kw: Any) -> Any:
        seen(httpx.Request("POST", s.url + path, content=content))
        return post(path, content, *a, **kw)

    return counted


def test_served_on_a_cluster_one_request_per_batch_and_an_executor_lost(cluster: LocalCluster,
                                                                         tmp_path: Path) -> None:
    model = _cnn(tmp_path / "cnn.tpm")
    server = tp.serve(tmp_path / "cnn.tpm", home=cluster.run.path, port=0, replicas=2, max_batch=8,
                      max_wait_ms=10, block=False)
    try:
        sent: Counter[str] = Counter()
        inline: list[int] = []  # per compiled-step request: its arguments sent inline

        def seen(r: httpx.Request) -> None:
            sent.update([f"{r.method} {r.url.path}"])
            if r.method == "POST" and r.url.path == "/v1/jobs":
                inline.append(sum(isinstance(a, dict) for a in json.loads(r.content).get("args", [])))

        for s in server.host.sessions:  # what the replicas send the scheduler from here on
            s._client.event_hooks["request"].append(seen)
            if s._wire is not None:  # job submits go on the session's own connections (remote_wire.py)
                s._wire.post = _counted(s, s._wire.post, seen)  # type: ignore[method-assign]
        misses = sum(s.counters()["trace_misses"] for s in server.host.sessions)
        auth = {"Authorization": f"Bearer {cluster.token}"}
        c = httpx.Client(base_url=server.url, headers=auth, timeout=60)
        xs = np.random.default_rng(0).random((40, 2, 1, 8, 8), dtype=np.float32)

        def one(i: int) -> tuple[int, float]:
            r = c.post("/v1/predict", json={"inputs": {"image": xs[i].tolist()}})
            if r.status_code != 200:
                return r.status_code, float("inf")
            got = np.array(r.json()["outputs"]["output"])
            return 200, float(np.abs(got - model(xs[i]).numpy()).max())

        executors = sorted(n["node"] for n in server.host.sessions[0].nodes())
        assert [s.prefer for s in server.host.sessions] == executors  # one replica per executor
        ran = tasks_by_node(cluster)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(20)))
        assert all(code == 200 for code, _ in results) and max(d for _, d in results) < 1e-5, results
        ran = tasks_by_node(cluster) - ran
        # each replica's batches ran on its executor: both executors took a fair share
        assert set(ran) == set(executors) and min(ran.values()) >= sum(ran.values()) / 4, ran
        metrics = c.get("/metrics").text.splitlines()
        batches = int(next(float(m.split()[1]) for m in metrics
                           if m.startswith("triplane_serve_batch_rows_count")))
        # warmed at load: no new structure was sent, and every batch was one POST /v1/jobs
        assert sum(s.counters()["trace_misses"] for s in server.host.sessions) == misses
        assert sent["POST /v1/tensors"] == 0, sent
        assert sent["POST /v1/jobs"] == batches, (sent, batches)
        # the batch travels inline; the parameters are bound by their upload ids
        assert inline == [1] * batches, inline

        killer = threading.Timer(0.5, cluster.kill_executor, args=(0, signal.SIGKILL))
        killer.start()
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(20, 40)))
        killer.join()
        assert all(code == 200 for code, _ in results), results
        assert max(d for _, d in results) < 1e-5
    finally:
        server.stop()


def test_triplane_serve_process_reloads_on_sighup(tmp_path: Path) -> None:
    first = _cnn(tmp_path / "m.tpm", seed=1)
    (tmp_path / "admin").write_text("cli-admin-token\n")
    ready = tmp_path / "ready.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "triplane", "serve", str(tmp_path / "m.tpm"),
                             "--embedded", "--port", "0", "--max-batch", "4",
                             "--admin-token-file", str(tmp_path / "admin"),
                             "--ready-file", str(ready), "--home", str(tmp_path / "home")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and proc.stdout.read()
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        auth = {"Authorization": "Bearer cli-admin-token"}
        c = httpx.Client(base_url=info["url"], headers=auth, timeout=30)
        x = np.ones((1, 1, 8, 8), np.float32)
        r = c.post("/v1/predict", json={"inputs": {"image": x.tolist()}})
        assert r.status_code == 200 and r.json()["model_version"] == first.digest[:12] == info["version"]
        second = _cnn(tmp_path / "m.tpm", seed=2)  # a new version in place
        proc.send_signal(signal.SIGHUP)
        while c.get("/v1/model").json()["version"] != second.digest[:12]:
            assert time.monotonic() < deadline + 30, "SIGHUP did not reload"
            time.sleep(0.1)
        r = c.post("/v1/predict", json={"inputs": {"image": x.tolist()}})
        np.testing.assert_allclose(np.array(r.json()["outputs"]["output"]), second(x).numpy(),
                                   rtol=1e-5, atol=1e-6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_triplane_serve_refuses_a_damaged_model_file_in_one_line(tmp_path: Path) -> None:
    _cnn(tmp_path / "m.tpm")
    data = bytearray((tmp_path / "m.tpm").read_bytes())
    data[-10] ^= 0xFF  # a parameter byte: its checksum no longer matches
    (tmp_path / "m.tpm").write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-m", "triplane", "serve", str(tmp_path / "m.tpm"), "--embedded",
                        "--port", "0", "--home", str(tmp_path / "home")],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, r
    assert "triplane serve:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "corrupted" in r.stderr or "checksum" in r.stderr.lower() or "SHA-256" in r.stderr, r.stderr
