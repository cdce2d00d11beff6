"""Spill on a real cluster: a job whose working set is three times the executors' memory
finishes by spilling to disk, with the same values as in-process (docs/storage.md); the job
persists its tiles too, and ``GET /v1/storage`` reports each engine's spilled and persisted
bytes as its executor counted them (the dashboard's Storage page)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cluster_memory import executor_stats

import triplane as tp
from triplane.engines.memory.persist import PERSIST_ENV
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session

MEMORY = 2 << 20  # each executor's host memory: 2 MiB
OUTPUTS = 12  # of 1 MiB each: 12 MiB kept by 2 executors of 2 MiB = 3 times their memory


def _graph(xa: np.ndarray) -> list[tp.Tensor]:
    x = tp.Tensor.from_array(xa)
    return [tp.tanh(x * float(i + 1)) + float(i) for i in range(OUTPUTS)]


def test_a_working_set_three_times_the_memory_finishes_by_spilling(
        start_cluster: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xa = np.random.default_rng(7).standard_normal((256, 1024)).astype(np.float32)  # 1 MiB
    want = [t.numpy() for t in _graph(xa)]  # in-process
    spill = tmp_path / "spill"
    monkeypatch.setenv(PERSIST_ENV, f"file:{tmp_path / 'persist'}")
    with start_cluster(bound_s=150, executors=2, memory=str(MEMORY),
                       executor_args=["--memory-engine", f"host,file:{spill}@64MiB"]) as cluster:
        with RemoteSession(cluster.url, cluster.token, job_timeout_s=90.0) as s, use_session(s):
            s.persist = "file"
            got = s.evaluate(_graph(xa))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        assert sum(g.nbytes for g in got) == 3 * 2 * MEMORY
        deadline = time.monotonic() + 10
        while True:  # executors publish their stats once a second
            stats = executor_stats(cluster)
            counters = {node: st.get("spill") for node, st in stats.items()}
            if (len(counters) == 2 and all(c is not None for c in counters.values())
                    and sum(c["reads"] for c in counters.values()) > 0
                    and sum(st["persist"]["bytes"] for st in stats.values()) >= 3 * 2 * MEMORY
                    ) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert len(counters) == 2 and all(c is not None for c in counters.values()), counters
        spilled = sum(c["spilled_bytes"] for c in counters.values())
        assert spilled >= sum(g.nbytes for g in got) - 2 * MEMORY, counters  # at least what did not fit
        assert sum(c["reads"] for c in counters.values()) > 0, counters  # read back to be fetched
        assert all(c["memory_used"] <= MEMORY for c in counters.values()), counters
        # the same counters through the public API, per memory engine (one per executor)
        auth = {"Authorization": f"Bearer {cluster.token}"}
        h = httpx.Client(base_url=cluster.url, headers=auth, timeout=10)
        engines = {e["node"]: e for e in h.get("/v1/storage").json()["engines"]}
        h.close()
        assert engines.keys() == counters.keys()
        for node, c in counters.items():
            assert engines[node]["spill"] == {"tiles": c["spills"], "bytes": c["spilled_bytes"],
                                              "reads": c["reads"], "read_bytes": c["read_bytes"],
                                              "on_disk": c["file_used"]}, (node, c)
            assert engines[node]["persisted"] == stats[node]["persist"], node
        persisted = sum(e["persisted"]["bytes"] for e in engines.values())
        assert sum(e["spill"]["bytes"] for e in engines.values()) == spilled
        # the job's tiles, each written once: its 12 outputs of 1 MiB and its few scalars
        assert sum(g.nbytes for g in got) <= persisted <= sum(g.nbytes for g in got) + 4096, persisted
        assert sum(e["persisted"]["tiles"] for e in engines.values()) >= OUTPUTS
