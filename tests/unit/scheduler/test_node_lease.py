"""A node's lease and health in ``GET /v1/nodes`` (``ClusterView.nodes``, docs/api.md): the
lease's age and time left as the registry has them, ``up`` while it was renewed within two
thirds of its TTL and ``late`` past that; on the in-memory registry with a clock moved by
hand."""

from __future__ import annotations

import asyncio

import pytest

from triplane.registry import MemoryBackend, NodeInfo
from triplane.registry.memory import MemoryStore
from triplane.registry.records import encode
from triplane.scheduler.cluster import ClusterView


def test_a_nodes_lease_ages_turns_late_and_a_renewal_makes_it_up_again() -> None:
    now = [1000.0]
    reg = MemoryBackend(MemoryStore(clock=lambda: now[0]))
    view = ClusterView(reg)

    async def node() -> dict:
        (n,) = await view.nodes()
        return n

    async def body() -> None:
        lease = await reg.grant_lease(6.0)
        info = NodeInfo("n1", "127.0.0.1", 1, 1, 1, "test", 0.0, 1)
        await reg.put(info.key(), encode(info), lease=lease)
        n = await node()
        assert n["health"] == "up" and n["lease"] == {"ttl_s": 6.0, "left_s": 6.0, "age_s": 0.0}
        now[0] += 4.0  # two thirds of the TTL: still up
        n = await node()
        assert n["health"] == "up" and n["lease"]["age_s"] == pytest.approx(4.0)
        now[0] += 0.5  # renewals missed: late, 1.5 s left
        n = await node()
        assert n["health"] == "late" and n["lease"]["left_s"] == pytest.approx(1.5)
        await reg.refresh_lease(lease)
        n = await node()
        assert n["health"] == "up" and n["lease"]["age_s"] == 0.0
        await reg.put("nodes/n1", encode(info))  # a record on no lease: health unknown
        n = await node()
        assert n["health"] == "unknown" and n["lease"] is None
        await reg.close()

    asyncio.run(body())
