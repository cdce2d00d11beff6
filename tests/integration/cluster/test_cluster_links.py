"""Per-pair network figures on a real local cluster: every executor measures each peer,
the pairs are in the registry and in ``triplane status``, and placement keeps a job's
tasks off an executor whose network engines are slowed (``--network-delay-ms``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from cluster_rows import task_rows

import triplane as tp
from triplane.launcher import cluster_status
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session

DELAY_MS = 30.0
SLOW = "executor-2"


def _links(home: Any, want: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        links = cluster_status(home)["links"]
        if len(links) >= want or time.monotonic() > deadline:
            return links
        time.sleep(0.5)


def test_pairs_are_published_shown_and_a_slowed_peer_gets_no_tasks(start_cluster: Callable[..., Any]) -> None:
    # --whole-s 0: the job is cut, so its tasks could spread (uncut it is one task on any node)
    with start_cluster(bound_s=150, executors=2, scheduler_args=["--whole-s", "0"]) as cluster:
        cluster.add_executor(extra_args=["--network-delay-ms", str(DELAY_MS)])
        home = cluster.run.path
        links = _links(home, 6)
        names = ("executor-0", "executor-1", SLOW)
        assert {(r["from"], r["to"]) for r in links} == {(a, b) for a in names for b in names if a != b}
        for r in links:
            assert r["engine"] == "tcp" and r["bandwidth_gbps"] > 0
            # a delayed frame may be let go up to a timer tick early: 0.9 of the delay tells the
            # slowed pairs (>= 30 ms) from the rest (well under 1 ms on loopback)
            assert (r["latency_us"] >= 0.9 * DELAY_MS * 1e3) == (SLOW in (r["from"], r["to"])), r

        shown = subprocess.run([sys.executable, "-m", "triplane", "status"], capture_output=True, text=True,
                               timeout=60, env={**os.environ, "TRIPLANE_HOME": str(home), "COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        assert "links (measured per pair)" in shown.stdout
        assert any(SLOW in line and "ms" in line for line in shown.stdout.splitlines())

        with RemoteSession(cluster.url, cluster.token, job_timeout_s=60.0) as s, use_session(s):
            parts = [tp.uniform((512, 512), seed=i) for i in range(6)]
            total = parts[0]
            for p in parts[1:]:
                total = total + p
            got = s.evaluate([total.sum()])[0]
            job = s.last_job
        rows = task_rows(cluster.db, job)
        by_node: dict[str, int] = {}
        for r in rows:
            by_node[r.node] = by_node.get(r.node, 0) + 1
        assert np.isfinite(got) and all(r.state == "done" for r in rows)
        # the job spreads over the fast executors (so an equal third would get a share) ...
        assert by_node.get("executor-0", 0) > 0 and by_node.get("executor-1", 0) > 0, by_node
        # ... and none of its tasks goes to the slowed peer
        assert by_node.get(SLOW, 0) == 0, by_node
