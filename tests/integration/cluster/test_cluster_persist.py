"""Persistence on a real cluster (docs/storage.md): the tiles of a job that asks to persist
to ``file`` (a directory every process shares) outlive the executor that made them. When
it is SIGKILLed mid-job, the job finishes and its events show reads of the persisted tiles,
not re-runs; a finished job's persisted result is still fetchable after its holder died,
and its release then deletes the tiles from the target."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cluster_rows import task_rows

import triplane as tp
from triplane import metadb as mdb
from triplane.engines.memory.file import FileMemoryEngine
from triplane.engines.memory.persist import PERSIST_ENV
from triplane.executor.tasks import STALL_ENV
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session


def _events(db_url: str, job: str, timeout_s: float = 15.0) -> list[Any]:
    """The job's events, once its end is written: the journal writes them in batches, after
    the job's answer."""
    db = mdb.open_db(db_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            with db.read() as s:
                events = list(mdb.list_events(s, job))
            ended = any(e.kind in ("job.done", "job.failed", "job.cancelled") for e in events)
            if ended or time.monotonic() > deadline:
                return events
            time.sleep(0.2)
    finally:
        db.close()


def test_a_sigkilled_executors_persisted_tiles_are_read_not_recomputed(
        start_cluster: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PERSIST_ENV, f"file:{tmp_path / 'persist'}")
    # w's exp stalls on its first attempt, so every matmul still needs the tanh tiles when
    # their holder is killed: without persistence they would be computed again.
    monkeypatch.setenv(STALL_ENV, "exp:6")
    rng = np.random.default_rng(11)
    xa = rng.standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB: tiled (--whole-s 0), not grouped
    wa = rng.standard_normal((1024, 64)).astype(np.float32) * 0.1
    with start_cluster(bound_s=150, executors=2, scheduler_args=["--whole-s", "0"]) as cluster:
        s = RemoteSession(cluster.url, cluster.token, job_timeout_s=90.0, reconnect_s=20.0, poll_s=0.2)
        s.persist = "file"
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                with use_session(s):
                    x, w = tp.Tensor.from_array(xa), tp.Tensor.from_array(wa)
                    result["got"] = s.evaluate([tp.tanh(x) @ tp.exp(w)])
            except BaseException as e:
                result["error"] = e

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        victim = None
        deadline = time.monotonic() + 40
        while victim is None and time.monotonic() < deadline:  # a node holding a done tanh tile
            job = s.last_job
            if job:
                rows = task_rows(cluster.db, job, timeout_s=0.0)
                done = [r for r in rows if r.state == "done" and r.op == "tanh" and r.node]
                if done:
                    victim = next(p for p in cluster.executors if p.name == done[0].node)
                    assert not [r for r in rows if r.op == "exp" and r.state == "done"]  # still stalled
            time.sleep(0.2)
        assert victim is not None, "no tanh tile was ever done"
        os.kill(victim.pid, signal.SIGKILL)
        worker.join(90)
        assert not worker.is_alive() and "error" not in result, result.get("error")
        np.testing.assert_allclose(result["got"][0], np.tanh(xa) @ np.exp(wa), rtol=1e-4, atol=1e-4)
        job = s.last_job
        events = _events(cluster.db, job)
        reads = [e for e in events if e.kind == "tile.persisted_read"]
        assert reads and all(e.node == "store:file" for e in reads), events
        assert {e.stimulus_id for e in reads} == {f"persisted:{victim.name}"}
        reruns = [e for e in events
                  if e.kind == "task.recomputed"]
        assert reruns == [], reruns  # nothing done was computed again
        rows = task_rows(cluster.db, job)
        assert all(r.attempt == 0 for r in rows if r.op == "tanh"), [(r.id, r.op, r.attempt) for r in rows]
        s.close()


def _graph(value: float, shape: tuple[int, int] = (3, 4)) -> dict[str, Any]:
    t = {"shape": list(shape), "dtype": "float32"}
    return {"version": 1, "outputs": ["n1"], "nodes": {
        "n0": {"op": "full", **t, "attrs": {"value": value, **t}},
        "n1": {"op": "exp", "inputs": ["n0"], **t}}}


def _wait_done(h: httpx.Client, job: str) -> None:
    deadline = time.monotonic() + 30
    while h.get(f"/v1/jobs/{job}").json()["state"] != "done":
        assert time.monotonic() < deadline, h.get(f"/v1/jobs/{job}").json()
        time.sleep(0.1)


def test_a_finished_jobs_persisted_result_is_fetchable_after_its_holder_died(
        start_cluster: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PERSIST_ENV, f"file:{tmp_path / 'persist'}")
    with start_cluster(bound_s=90, executors=2, memory="12MiB") as cluster:
        h = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                         timeout=10)
        body = {"graph": _graph(1.0), "fetch": ["n1"], "persist": "file"}
        kept = h.post("/v1/jobs", json=body).json()["id"]
        big = (1024, 2048)  # 8 MiB, twice, on executors of 12 MiB: cut in tiles, fetched tile by tile
        body = {"graph": _graph(1.5, big), "fetch": ["n1"], "persist": "file"}
        tiled = h.post("/v1/jobs", json=body).json()["id"]
        # (1 KiB: over what a reply carries to the scheduler's memory, proto/packet.md)
        plain = h.post("/v1/jobs", json={"graph": _graph(2.0, (16, 16)), "fetch": ["n1"]}).json()["id"]
        for job in (kept, tiled, plain):
            _wait_done(h, job)
        assert len(task_rows(cluster.db, tiled)) > 2  # tiled indeed
        holders = {r.node for job in (kept, tiled, plain) for r in task_rows(cluster.db, job)}
        for i, p in enumerate(cluster.executors):  # every holder dies
            if p.name in holders:
                cluster.kill_executor(i)
        r = h.get(f"/v1/jobs/{kept}/tensors/n1")
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.frombuffer(r.content, dtype=np.float32).reshape(3, 4),
                                   np.exp(np.ones((3, 4), np.float32)), rtol=1e-6)
        r = h.get(f"/v1/jobs/{tiled}/tensors/n1")
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.frombuffer(r.content, dtype=np.float32).reshape(big),
                                   np.exp(np.full(big, 1.5, np.float32)), rtol=1e-6)
        r = h.get(f"/v1/jobs/{plain}/tensors/n1")  # the control: not persisted, gone with its holder
        assert r.status_code in (404, 503) and "executor-" in r.text, r.text
        deadline = time.monotonic() + 20
        # the dead holders are forgotten within the lease TTL
        while holders & {n["node"] for n in h.get("/v1/nodes").json()["items"]}:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        r = h.get(f"/v1/jobs/{kept}/tensors/n1")
        assert r.status_code == 200, r.text
        r = h.get(f"/v1/jobs/{plain}/tensors/n1")
        assert r.status_code == 404 and "which is gone" in r.text, r.text

        # Released after their holders died: the scheduler deletes the tiles from the target.
        def persisted(job: str) -> list[str]:
            held = FileMemoryEngine(1 << 40, path=tmp_path / "persist").keys()  # not iterable itself
            return [k for k in held if k.startswith(f"{job}.")]

        assert persisted(kept) and len(persisted(tiled)) > 1
        for job in (kept, tiled):
            assert h.delete(f"/v1/jobs/{job}").status_code == 200
        deadline = time.monotonic() + 10
        while persisted(kept) or persisted(tiled):
            assert time.monotonic() < deadline, (persisted(kept), persisted(tiled))
            time.sleep(0.2)
        h.close()


def test_a_redis_persisted_result_is_fetchable_after_its_holder_died(
        start_cluster: Callable[..., Any], redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PERSIST_ENV, redis_url)
    with start_cluster(bound_s=60, executors=1) as cluster:
        h = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                         timeout=10)
        body = {"graph": _graph(0.5), "fetch": ["n1"], "persist": "redis"}
        job = h.post("/v1/jobs", json=body).json()["id"]
        _wait_done(h, job)
        cluster.kill_executor(0)
        r = h.get(f"/v1/jobs/{job}/tensors/n1")
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.frombuffer(r.content, dtype=np.float32).reshape(3, 4),
                                   np.exp(np.full((3, 4), 0.5, np.float32)), rtol=1e-6)
        h.close()


def test_a_persist_target_the_cluster_lacks_is_refused_at_submit(start_cluster: Callable[..., Any]) -> None:
    with start_cluster(bound_s=60, executors=1) as cluster:
        h = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                         timeout=10)
        doc = {"graph": _graph(1.0), "fetch": ["n1"], "persist": "redis"}
        r = h.post("/v1/jobs", json=doc)
        assert r.status_code == 400 and "names no persistence target" in r.text, r.text
        r = h.post("/v1/jobs", json={**doc, "persist": "tape"})
        assert r.status_code == 400 and "'persist' must be" in r.text, r.text
        h.close()
