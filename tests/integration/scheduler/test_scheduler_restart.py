"""Chaos: a scheduler SIGKILLed mid-job and restarted on the memory registry it serves itself
keeps the job's progress -- no task that had finished runs again.

The memory registry dies with the scheduler; the executors' registry clients find the
restarted one at the same address and register again, and the restarted scheduler waits
for them before it counts the tasks their rows say are done. Counted on the metadb: every
task row that was done when the scheduler died keeps its kernel times (a task run again
would write new ones), and the resume log line counts them all as done.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from triplane import metadb as mdb
from triplane.registry.etcd_server import free_port

HARD_BOUND_S = 120.0
TOKEN = "integration-token-0123456789"
TASKS = 4000  # about 2 s of tasks run one after another: killed early in it


class Cluster:
    """A scheduler serving the memory registry on a fixed port and two executors on it;
    every process is ended by its own pid (a watchdog ends them all after HARD_BOUND_S)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        (tmp / "token").write_text(TOKEN)
        (tmp / "secret").write_text("integration-secret-0123456789")
        self.db = f"sqlite:///{tmp / 'meta.sqlite3'}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts = 0

    def _start(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "TRIPLANE_TOKEN": TOKEN, "PYTHONPATH": str(Path(__file__).parents[3])}
        with open(log, "ab") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[3],
                                 env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def scheduler(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        ready = self.tmp / f"scheduler{self.starts}.ready"
        p = self._start([sys.executable, "-m", "triplane.scheduler.cli", "--registry", "memory://",
                         "--db", self.db, "--port", str(self.port), "--run-dir", str(self.tmp / "run"),
                         "--token-file", str(self.tmp / "token"), "--secret-file", str(self.tmp / "secret"),
                         "--ready-file", str(ready), "--log-level", "info"], self.tmp / "scheduler.log")
        wait_for(lambda: ready.exists() or p.poll() is not None, 30, "the scheduler to start")
        assert p.poll() is None, self.log()
        return p

    def executor(self, name: str) -> subprocess.Popen[bytes]:
        return self._start([sys.executable, "-m", "triplane.executor", "--registry", self.url, "--name", name,
                            "--memory", "64MiB", "--secret-file", str(self.tmp / "secret"),
                            "--log-level", "warning"], self.tmp / f"{name}.log")

    def log(self) -> str:
        return (self.tmp / "scheduler.log").read_text(errors="replace")

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


def wait_for(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20)


def chain(n: int) -> dict:
    """A random source and a chain of n - 1 elementwise tasks on it, every link an output
    (so fusion keeps them apart): n tasks, one after another."""
    nodes = {"c0": {"op": "normal", "shape": [4], "dtype": "float32",
                    "attrs": {"seed": 5, "shape": [4], "dtype": "float32"}}}
    for i in range(1, n):
        nodes[f"c{i}"] = {"op": "exp" if i % 2 else "tanh", "inputs": [f"c{i - 1}"], "shape": [4],
                          "dtype": "float32"}
    return {"version": 1, "nodes": nodes, "outputs": [f"c{i}" for i in range(n)]}


def done_count(db_url: str, job: str) -> int:
    """How many of the job's task rows are done (a cheap read, polled while the job runs)."""
    with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=5)) as c:
        row = c.execute("SELECT count(*) FROM tasks WHERE job_id = ? AND state = 'done'", (job,)).fetchone()
    return int(row[0])


def done_rows(db_url: str, job: str) -> dict[str, tuple[str | None, float | None]]:
    """task -> (node, kernel end) of the job's task rows that are done."""
    db = mdb.open_db(db_url)
    try:
        with db.read() as s:
            return {t.task_id: (t.node, t.finished_at) for t in mdb.list_tasks(s, job, states=["done"])}
    finally:
        db.close()


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    watchdog = threading.Timer(HARD_BOUND_S, c.kill_all)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield c
    finally:
        watchdog.cancel()
        c.kill_all()


def test_a_restarted_scheduler_on_the_memory_registry_reruns_no_finished_task(cluster: Cluster) -> None:
    first = cluster.scheduler()
    cluster.executor("exa")
    cluster.executor("exb")
    last = f"c{TASKS - 1}"
    with client(cluster.url) as h:
        wait_for(lambda: len(h.get("/v1/nodes").json()["items"]) == 2, 40, "two executors to register")
        r = h.post("/v1/jobs", json={"graph": chain(TASKS), "fetch": [last]})
        assert r.status_code == 201, r.text
        job = r.json()["id"]
    wait_for(lambda: done_count(cluster.db, job) > 200, 30, "done tasks on record")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(5)
    before = done_rows(cluster.db, job)
    assert 0 < len(before) < TASKS, len(before)  # killed mid-job, with progress on record

    cluster.scheduler()  # same port, same metadb: the executors' registry clients come back to it
    with client(cluster.url) as h:
        body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 60}).json()
        assert body["state"] == "done", body
        got = np.frombuffer(h.get(f"/v1/jobs/{job}/tensors/{last}").content, np.float32)
        # The same graph run from scratch gives the same values (random sources are seeded).
        again = h.post("/v1/jobs", json={"graph": chain(TASKS), "fetch": [last]}).json()["id"]
        assert h.get(f"/v1/jobs/{again}/wait", params={"timeout": 60}).json()["state"] == "done"
        want = np.frombuffer(h.get(f"/v1/jobs/{again}/tensors/{last}").content, np.float32)
    np.testing.assert_array_equal(got, want)

    line = r"resumed job (\w+) \((\d+) of (\d+) tasks already done\)"
    resumed = [m for m in re.finditer(line, cluster.log()) if m.group(1) == job]
    assert len(resumed) == 1, cluster.log()[-3000:]
    assert int(resumed[0].group(2)) == len(before) and int(resumed[0].group(3)) == TASKS, resumed[0].group(0)
    after = done_rows(cluster.db, job)
    assert len(after) == TASKS
    rerun = [t for t, row in before.items() if after[t] != row]
    assert rerun == [], f"{len(rerun)} finished tasks ran again, e.g. {rerun[:5]}"
