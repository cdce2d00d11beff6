"""Spill on a real cluster: a job whose working set is three times the executors' memory
finishes by spilling to disk, with the same values as in-process (docs/storage.md)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.registry import connect_registry
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session

MEMORY = 2 << 20  # each executor's host memory: 2 MiB
OUTPUTS = 12  # of 1 MiB each: 12 MiB kept by 2 executors of 2 MiB = 3 times their memory


def _spill_counters(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    async def read() -> dict[str, dict[str, Any]]:
        reg = connect_registry(cluster.executor_registry, secret=cluster.run.secret_file.read_text().strip())
        try:
            return {e.key.removeprefix("stats/"): json.loads(e.value).get("spill")
                    for e in await reg.get_prefix("stats/")}
        finally:
            await reg.close()

    return asyncio.run(read())


def _graph(xa: np.ndarray) -> list[tp.Tensor]:
    x = tp.Tensor.from_array(xa)
    return [tp.tanh(x * float(i + 1)) + float(i) for i in range(OUTPUTS)]


def test_a_working_set_three_times_the_memory_finishes_by_spilling(
        start_cluster: Callable[..., Any], tmp_path: Path) -> None:
    xa = np.random.default_rng(7).standard_normal((256, 1024)).astype(np.float32)  # 1 MiB
    want = [t.numpy() for t in _graph(xa)]  # in-process
    spill = tmp_path / "spill"
    with start_cluster(bound_s=150, executors=2, memory=str(MEMORY),
                       executor_args=["--memory-engine", f"host,file:{spill}@64MiB"]) as cluster:
        with RemoteSession(cluster.url, cluster.token, job_timeout_s=90.0) as s, use_session(s):
            got = s.evaluate(_graph(xa))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        assert sum(g.nbytes for g in got) == 3 * 2 * MEMORY
        deadline = time.monotonic() + 10
        while True:  # executors publish their stats once a second
            counters = _spill_counters(cluster)
            if (len(counters) == 2 and all(c is not None for c in counters.values())
                    and sum(c["reads"] for c in counters.values()) > 0) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert len(counters) == 2 and all(c is not None for c in counters.values()), counters
        spilled = sum(c["spilled_bytes"] for c in counters.values())
        assert spilled >= sum(g.nbytes for g in got) - 2 * MEMORY, counters  # at least what did not fit
        assert sum(c["reads"] for c in counters.values()) > 0, counters  # read back to be fetched
        assert all(c["memory_used"] <= MEMORY for c in counters.values()), counters
