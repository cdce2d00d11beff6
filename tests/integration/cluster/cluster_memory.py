"""Executor memory and counters as the cluster tests read them: the free bytes of every
node's memory engine from ``GET /v1/nodes``, and each executor's ``stats/<node>`` record
from the registry (executors publish both every second)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from triplane.launcher import LocalCluster
from triplane.registry import connect_registry


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


def executor_stats(c: LocalCluster) -> dict[str, dict[str, Any]]:
    """Each executor's published counters (``stats/<node>``), by node."""

    async def read() -> dict[str, dict[str, Any]]:
        reg = connect_registry(c.executor_registry, secret=c.run.secret_file.read_text().strip())
        try:
            return {e.key.removeprefix("stats/"): json.loads(e.value) for e in await reg.get_prefix("stats/")}
        finally:
            await reg.close()

    return asyncio.run(read())


def settled_stats(c: LocalCluster, part: str | None = None, timeout_s: float = 24.0) -> dict[str, Any]:
    """``executor_stats`` (or each node's ``part`` of them, e.g. ``"cache"``) once two reads a
    publication apart agree."""

    def read() -> dict[str, Any]:
        return {n: s if part is None else s[part] for n, s in executor_stats(c).items()}

    end = time.monotonic() + timeout_s
    last = read()
    while time.monotonic() < end:
        time.sleep(1.2)
        now = read()
        if now == last:
            return now
        last = now
    return last
