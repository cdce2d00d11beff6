"""Lineage recompute on a real cluster (docs/storage.md, "Lineage recompute"): the result
tiles of finished jobs whose holder was SIGKILLed, with no persisted copy, are computed
again by the scheduler from the jobs' plans -- only the tasks needed -- when a fetch or a
later job's ref reads them; the values equal numpy and the event log says
``task.recomputed``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
from cluster_rows import task_rows

from triplane import metadb as mdb

N, K = 1024, 1024  # tanh(x) @ w, 4 MiB each: cut in tiles, spread over both executors


def _events(db_url: str, job: str, kind: str, want: int, timeout_s: float = 15.0) -> list[Any]:
    """The job's events of ``kind`` once there are ``want`` (the journal writes in batches)."""
    db = mdb.open_db(db_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            with db.read() as s:
                found = [e for e in mdb.list_events(s, job) if e.kind == kind]
            if len(found) >= want or time.monotonic() > deadline:
                return found
            time.sleep(0.2)
    finally:
        db.close()


def _upload(h: httpx.Client, a: np.ndarray) -> str:
    r = h.post("/v1/tensors", content=a.tobytes(),
               headers={"X-Triplane-Shape": ",".join(map(str, a.shape)), "X-Triplane-Dtype": "float32"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _fetch(h: httpx.Client, job: str, name: str) -> np.ndarray:
    r = h.get(f"/v1/jobs/{job}/tensors/{name}")
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, np.float32).reshape(N, K)


def _inp(tensor: str, shape: tuple[int, int]) -> dict[str, Any]:
    t = {"shape": list(shape), "dtype": "float32"}
    return {"op": "input", **t, "attrs": {"tensor": tensor, **t}}


def _op(name: str, shape: tuple[int, int], *inputs: str) -> dict[str, Any]:
    return {"op": name, "inputs": list(inputs), "shape": list(shape), "dtype": "float32", "attrs": {}}


def _run(h: httpx.Client, nodes: dict[str, Any], fetch: str) -> str:
    graph = {"version": 1, "nodes": nodes, "outputs": [fetch]}
    r = h.post("/v1/jobs", json={"graph": graph, "fetch": [fetch]})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 60}).json()
    assert body["state"] == "done", body
    return str(job)


def _results(h: httpx.Client, job: str) -> dict[str, str]:
    """The job's result tiles: task -> the node holding it (once the journal wrote them)."""
    deadline = time.monotonic() + 10
    while True:
        items = h.get(f"/v1/jobs/{job}/tiles", params={"limit": 1000}).json()["items"]
        if (items and all(t["node"] for t in items)) or time.monotonic() > deadline:
            return {t["plan_node"]: t["node"] for t in items}
        time.sleep(0.2)


def test_lost_tiles_of_finished_jobs_are_recomputed_for_a_fetch_and_a_ref(
        start_cluster: Callable[..., Any]) -> None:
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (N, N)).astype(np.float32)
    w = (rng.uniform(-1, 1, (N, K)) * 0.01).astype(np.float32)
    # --whole-s 0: each job is cut over both executors, so killing one loses part of each
    with start_cluster(bound_s=150, executors=2, scheduler_args=["--whole-s", "0"]) as cluster:
        h = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                         timeout=60)
        ux, uw = _upload(h, x), _upload(h, w)

        def graph(act: str) -> dict[str, Any]:
            return {"x": _inp(ux, (N, N)), "w": _inp(uw, (N, K)), "y": _op(act, (N, N), "x"),
                    "z": _op("matmul", (N, K), "y", "w")}

        fetched, referred = _run(h, graph("tanh"), "z"), _run(h, graph("sin"), "z")
        held = {job: _results(h, job) for job in (fetched, referred)}
        victim = sorted(held[fetched].values())[0]
        lost = {job: {t for t, n in tiles.items() if n == victim} for job, tiles in held.items()}
        assert lost[fetched] and lost[referred], held  # both jobs kept result tiles there
        assert len(set(held[fetched].values())) == 2, held  # and on the other executor too
        total = len(task_rows(cluster.db, fetched))

        cluster.kill_executor(int(victim.rsplit("-", 1)[1]))
        deadline = time.monotonic() + 20  # until the scheduler knows it is gone (its lease ends)
        while victim in {n["node"] for n in h.get("/v1/nodes").json()["items"]}:
            assert time.monotonic() < deadline
            time.sleep(0.2)

        got = _fetch(h, fetched, "z")
        np.testing.assert_allclose(got, np.tanh(x) @ w, rtol=1e-4, atol=1e-4)
        again = _events(cluster.db, fetched, "task.recomputed", len(lost[fetched]))
        ran = {e.task_id for e in again}
        assert {t for t in ran if t in held[fetched]} == lost[fetched], (ran, held)  # only the lost results
        assert ran - set(held[fetched]), ran  # and the freed intermediates they read (lineage)
        assert len(ran) < total, (ran, total)  # not the whole job
        results = [e for e in again if e.task_id in lost[fetched]]
        assert all(e.payload["reason"] == f"lost:{victim}" for e in results), again
        assert all(e.payload["reason"] in (f"lost:{victim}", "freed") and e.payload["from"] == "done"
                   for e in again), again
        assert set(_results(h, fetched).values()) == {n for n in ("executor-0", "executor-1") if n != victim}
        assert h.get(f"/v1/jobs/{fetched}").json()["state"] == "done"

        # A later job reading the other job's result by ref: computed again at its submit.
        later = _run(h, {"p": _inp(f"{referred}:z", (N, K)), "q": _op("mul", (N, K), "p", "p")}, "q")
        np.testing.assert_allclose(_fetch(h, later, "q"), (np.sin(x) @ w) ** 2, rtol=1e-4, atol=1e-5)
        again = _events(cluster.db, referred, "task.recomputed", len(lost[referred]))
        assert {e.task_id for e in again if e.task_id in held[referred]} == lost[referred]
        h.close()
