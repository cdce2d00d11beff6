"""Uploads are cached where they are used: a tiled job submitted twice on 2 executor processes.

The first run pulls every upload tile from the scheduler's data server; the executors
keep them (docs/executor.md, "Upload cache") and the scheduler learns where
(``scheduler/residency.py``). The second run is placed where its tiles already are: its
plan predicts no pull from the scheduler, the executors' counters show no new pull and
as many cache hits as upload tiles read, and the result is the same.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from cluster_memory import settled_stats  # the cluster tests' reader of executor counters

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.sdk.remote import RemoteSession
from triplane.sdk.tensor import build_graph


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, running_cluster: Any) -> Iterator[LocalCluster]:
    # 64 MiB each: a 40 MB input must be cut into tiles, a few per executor.
    with running_cluster(tmp_path_factory.mktemp("upcache"), bound_s=240.0,
                                            executors=2, memory="64MiB") as c:
        yield c


def _scheduler_pulls(plan: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["task"], p["tensor"]) for t in plan["tasks"] for p in t["pulls"] if p["from"] == "scheduler"]


def test_second_run_reads_its_upload_tiles_where_they_are_cached(cluster: LocalCluster) -> None:
    x = np.random.default_rng(7).standard_normal((4001, 2500)).astype(np.float32)  # 40 MB
    session = RemoteSession(cluster.url, cluster.token, job_timeout_s=120.0)
    api = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                       timeout=60.0)
    try:
        out = (tp.tensor(x) * 0.5 + 1.0).exp()
        graph, _, bindings = build_graph([out])
        cgraph, rename, args = graph.canonical()
        doc = json.loads(cgraph.to_json())
        for node in doc["nodes"].values():
            if node["op"] == "input":
                node["attrs"]["tensor"] = session.upload(bindings[args[int(node["attrs"]["tensor"][3:])]])
        fetch = [rename[out._id]]

        def run() -> tuple[np.ndarray, dict[str, Any]]:
            job = session.submit(doc, fetch)
            session.wait(job)
            got = session.fetch(job, fetch[0])
            plan = api.get(f"/v1/jobs/{job}/plan").json()
            api.delete(f"/v1/jobs/{job}")
            return got, plan

        first, plan1 = run()
        before = settled_stats(cluster, "cache")
        second, plan2 = run()
        after = settled_stats(cluster, "cache")
    finally:
        api.close()
        session.close()

    np.testing.assert_allclose(first, np.exp(x.astype(np.float64) * 0.5 + 1.0), rtol=1e-6)
    np.testing.assert_array_equal(second, first)

    assert plan1["tiled"] and plan1["followed"]
    read = _scheduler_pulls(plan1)
    assert len(read) >= 2, plan1["tasks"]  # several upload tiles, pulled in the first run
    assert len({t["node"] for t in plan1["tasks"]}) == 2  # on both executors
    # The second run is placed where each tile is cached: no pull from the scheduler
    # predicted, no comm time for the tasks that read them, no pull made.
    assert _scheduler_pulls(plan2) == []
    readers = {task for task, _ in read}
    assert all(t["predicted"]["comm_s"] == 0.0 for t in plan2["tasks"] if t["task"] in readers)
    assert sum(c["pulls"] for c in before.values()) == len(read)
    assert sum(c["pulls"] for c in after.values()) == len(read)
    assert sum(c["hits"] - before[n]["hits"] for n, c in after.items()) == len(read)
    assert all(c["evictions"] == 0 and c["lost"] == [] for c in after.values())
