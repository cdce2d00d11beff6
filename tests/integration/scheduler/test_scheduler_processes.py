"""The scheduler as a real process, with real executor processes, on a real etcd (loopback).

Every process is started by the fixtures and killed by them, also on failure; a watchdog
kills everything after ``HARD_BOUND_S`` so that no test can hang the suite. Covered: the
same results as the embedded run, 401/400/413 errors, cancel, and a leader killed mid-job
(the standby takes over, resumes the job from the shared DB and finishes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from triplane.registry.etcd_server import EtcdServer, find_etcd_binary, free_port

pytestmark = pytest.mark.skipif(
    find_etcd_binary() is None, reason="no etcd binary (apt-get install etcd-server)"
)

HARD_BOUND_S = 100.0
TOKEN = "integration-token-0123456789"


class Procs:
    """Processes this module started; ``kill_all`` ends each by its own pid."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:  # the child keeps its own descriptor
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[3],
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait(5)


class Cluster:
    def __init__(self, tmp: Path, procs: Procs, etcd: EtcdServer) -> None:
        self.tmp, self.procs, self.etcd = tmp, procs, etcd
        (tmp / "token").write_text(TOKEN)
        (tmp / "secret").write_text("integration-secret-0123456789")
        self.db = f"sqlite:///{tmp / 'meta.sqlite3'}"

    def scheduler(self, name: str) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        ready = self.tmp / f"{name}.ready"
        p = self.procs.start(
            [
                sys.executable,
                "-m",
                "triplane.scheduler.cli",
                "--registry",
                self.etcd.url,
                "--db",
                self.db,
                "--port",
                str(port),
                "--run-dir",
                str(self.tmp / "run"),
                "--token-file",
                str(self.tmp / "token"),
                "--secret-file",
                str(self.tmp / "secret"),
                "--max-upload-bytes",
                "100000",
                "--ready-file",
                str(ready),
                "--log-level",
                "warning",
            ],
            self.tmp / f"{name}.log",
        )
        wait_for(lambda: ready.exists() or p.poll() is not None, 30, f"scheduler {name} to start")
        assert p.poll() is None, (self.tmp / f"{name}.log").read_text()
        return p, json.loads(ready.read_text())["url"]

    def executor(self, name: str) -> subprocess.Popen[bytes]:
        return self.procs.start(
            [
                sys.executable,
                "-m",
                "triplane.executor",
                "--registry",
                self.etcd.url,
                "--name",
                name,
                "--memory",
                "64MiB",
                "--secret-file",
                str(self.tmp / "secret"),
                "--log-level",
                "warning",
            ],
            self.tmp / f"{name}.log",
        )


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def client(url: str, token: str = TOKEN) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=20)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    tmp = tmp_path_factory.mktemp("sched")
    procs = Procs()
    etcd = EtcdServer(tmp / "etcd")
    watchdog = threading.Timer(HARD_BOUND_S, lambda: (procs.kill_all(), etcd.stop()))
    watchdog.daemon = True
    watchdog.start()
    try:
        etcd.start()
        c = Cluster(tmp, procs, etcd)
        _, url = c.scheduler("leader")
        c.executor("exa")
        c.executor("exb")
        with client(url) as h:
            wait_for(lambda: len(h.get("/v1/nodes").json()["items"]) == 2, 40, "two executors to register")
        yield c, url
    finally:
        watchdog.cancel()
        procs.kill_all()
        etcd.stop()


def test_results_equal_the_embedded_run(cluster: tuple[Cluster, str]) -> None:
    import triplane as tp
    from triplane.sdk.remote import RemoteSession
    from triplane.sdk.session import use_session

    _, url = cluster
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((8, 5)).astype(np.float32)
    ws = rng.standard_normal((5, 3)).astype(np.float32)

    def build() -> list:  # fresh tensors each time: a tensor caches its value once computed
        y = (tp.tensor(xs) @ tp.tensor(ws)).relu() + 1.0
        return [y, y.exp().sum(axis=1)]

    expected = [t.numpy() for t in build()]
    remote = RemoteSession(url, TOKEN, job_timeout_s=30)
    with use_session(remote):
        got = [t.numpy() for t in build()]
    assert remote.last_job is not None
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    with client(url) as h:
        body = h.get(f"/v1/jobs/{remote.last_job}").json()
        assert body["state"] == "done" and body["progress"]["done"] == body["progress"]["total"] > 0, body


def test_bad_token_and_bad_requests(cluster: tuple[Cluster, str]) -> None:
    _, url = cluster
    with client(url, "wrong-token") as h:
        assert h.get("/v1/jobs").status_code == 401
    assert httpx.get(f"{url}/v1/nodes").status_code == 401
    assert httpx.get(f"{url}/v1/health").json()["role"] == "leader"
    with client(url) as h:
        r = h.post(
            "/v1/tensors",
            content=bytes(200_000),
            headers={"X-Triplane-Shape": "50000", "X-Triplane-Dtype": "float32"},
        )
        assert r.status_code == 413
        u = h.post(
            "/v1/tensors",
            content=np.ones(4, np.float32).tobytes(),
            headers={"X-Triplane-Shape": "4", "X-Triplane-Dtype": "float32"},
        ).json()["id"]
        nodes = {
            "x": {
                "op": "input",
                "shape": [4],
                "dtype": "float32",
                "attrs": {"tensor": u, "shape": [4], "dtype": "float32"},
            },
            "y": {"op": "exp", "inputs": ["x"], "shape": [5], "dtype": "float32"},
        }
        r = h.post(
            "/v1/jobs", json={"graph": {"version": 1, "nodes": nodes, "outputs": ["y"]}, "fetch": ["y"]}
        )
        assert r.status_code == 400 and r.json()["error"]["node"] == "y"
        nodes["y"] = {"op": "no_such_op", "inputs": ["x"], "shape": [4], "dtype": "float32"}
        r = h.post(
            "/v1/jobs", json={"graph": {"version": 1, "nodes": nodes, "outputs": ["y"]}, "fetch": ["y"]}
        )
        assert r.status_code == 400 and r.json()["error"]["kind"] == "unknown_op"
        assert h.get("/v1/health").json()["ok"] is True  # still serving


def upload_zeros(h: httpx.Client) -> str:
    r = h.post(
        "/v1/tensors", content=bytes(16), headers={"X-Triplane-Shape": "4", "X-Triplane-Dtype": "float32"}
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def chain_graph(n: int, u: str) -> dict:
    """A chain of n - 1 tasks on an uploaded tensor (an upload is not folded at compile time;
    every link is an output, so fusion keeps them apart)."""
    nodes = {
        "c0": {
            "op": "input",
            "shape": [4],
            "dtype": "float32",
            "attrs": {"tensor": u, "shape": [4], "dtype": "float32"},
        }
    }
    for i in range(1, n):
        nodes[f"c{i}"] = {
            "op": "exp" if i % 2 else "tanh",
            "inputs": [f"c{i - 1}"],
            "shape": [4],
            "dtype": "float32",
        }
    return {"version": 1, "nodes": nodes, "outputs": [f"c{i}" for i in range(1, n)]}


def test_a_task_packet_larger_than_a_datagram_goes_over_tcp(cluster: tuple[Cluster, str]) -> None:
    _, url = cluster
    with client(url) as h:
        doc = chain_graph(1200, upload_zeros(h))
        doc["outputs"] = ["c1199"]  # one fused task whose program needs a ~20 KB packet
        job = h.post("/v1/jobs", json={"graph": doc, "fetch": ["c1199"]}).json()["id"]
        body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 20}).json()
        assert body["state"] == "done" and body["progress"]["total"] == 1, body
        got = np.frombuffer(h.get(f"/v1/jobs/{job}/tensors/c1199").content, np.float32)
    v = np.zeros(4, np.float32)
    for i in range(1, 1200):
        v = np.exp(v) if i % 2 else np.tanh(v)
    np.testing.assert_allclose(got, v, rtol=1e-6)


def test_cancel_stops_a_running_job(cluster: tuple[Cluster, str]) -> None:
    _, url = cluster
    with client(url) as h:
        r = h.post("/v1/jobs", json={"graph": chain_graph(3000, upload_zeros(h)), "fetch": ["c2999"]})
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        r = h.delete(f"/v1/jobs/{job}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 5}).json()
        assert body["state"] == "cancelled" and body["progress"]["done"] < 3000
        assert h.get(f"/v1/jobs/{job}/tensors/c2999").status_code == 409


def test_standby_takes_over_and_resumes_a_job_when_the_leader_dies(cluster: tuple[Cluster, str]) -> None:
    c, url = cluster
    _, standby_url = c.scheduler("standby")
    with client(standby_url) as s:
        assert s.get("/v1/health").json()["role"] == "standby"
        r = s.post("/v1/jobs", json={"graph": {"version": 1, "nodes": {}, "outputs": []}, "fetch": []})
        assert r.status_code == 503 and "leader" in r.json()["error"]["message"]
    with client(url) as h:
        r = h.post("/v1/jobs", json={"graph": chain_graph(1500, upload_zeros(h)), "fetch": ["c1499"]})
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        wait_for(lambda: h.get(f"/v1/jobs/{job}").json()["progress"]["done"] > 100, 20, "progress")
    leader = c.procs.procs[0]
    os.kill(leader.pid, signal.SIGKILL)  # no resignation: the standby waits for the lease to expire
    leader.wait(5)
    with client(standby_url) as s:
        wait_for(lambda: s.get("/v1/health").json()["role"] == "leader", 30, "the standby to lead")
        body = s.get(f"/v1/jobs/{job}/wait", params={"timeout": 30}).json()
        assert body["state"] == "done", body
        got = np.frombuffer(s.get(f"/v1/jobs/{job}/tensors/c1499").content, np.float32)
    v = np.zeros(4, np.float32)
    for i in range(1, 1500):
        v = np.exp(v) if i % 2 else np.tanh(v)
    np.testing.assert_allclose(got, v, rtol=1e-6)
