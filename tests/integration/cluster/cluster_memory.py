"""Executor memory as the cluster tests read it: the free bytes of every node's memory
engine from ``GET /v1/nodes`` (executors publish them every second)."""

from __future__ import annotations

import time

import httpx

from triplane.launcher import LocalCluster


def free_bytes(c: LocalCluster) -> int:
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.token}"}, timeout=10.0) as h:
        return sum(n["memory"]["free"] for n in h.get("/v1/nodes").json()["items"])


def settled_free(c: LocalCluster, want: int | None = None, timeout_s: float = 15.0) -> int:
    """Free executor bytes once they stop changing (or reach ``want``)."""
    end = time.monotonic() + timeout_s
    last = free_bytes(c)
    while time.monotonic() < end:
        time.sleep(1.2)
        now = free_bytes(c)
        if (want is not None and now >= want) or (want is None and now == last):
            return now
        last = now
    return last
