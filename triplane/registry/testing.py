"""The registry conformance suite: mixins a backend (ours or a vendor's) must pass.

Use it from a pytest module::

    class TestMyBackend(RegistryBackendConformance, NodeRegistryConformance):
        @pytest.fixture
        def registry_harness(self) -> Iterator[RegistryHarness]:
            yield MyHarness()          # .client() -> a new client on one shared store

Each test runs its own event loop, bounded by ``timeout_s``; clients are made inside it.
Lease tests sleep for real (TTL 1 s, rounded up by the backend), so the suite takes
tens of seconds per backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import pytest

from triplane.registry.backend import Entry, LeaseNotFound, RegistryBackend, WatchEvent
from triplane.registry.leader import LEADER_KEY, campaign, leader
from triplane.registry.nodes import (
    list_memory_engines,
    list_nodes,
    list_op_engines,
    register_node,
    watch_nodes,
)
from triplane.registry.records import Binding, MemoryEngineInfo, NodeInfo, OpEngineInfo, encode

__all__ = [
    "NodeRegistryConformance",
    "RegistryBackendConformance",
    "RegistryHarness",
    "eventually",
    "next_event",
    "run",
    "sample_node",
]

T = TypeVar("T")


class RegistryHarness(Protocol):
    """What the suite needs from a backend under test."""

    def client(self) -> RegistryBackend:
        """A new client on the store every other client of this harness sees."""
        ...


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
    """Run ``coro`` in a fresh event loop, failing the test after ``timeout_s``."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Poll ``check`` every 50 ms until true; the seconds it took. AssertionError on timeout."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def next_event(events: Any, timeout_s: float = 5.0) -> WatchEvent:
    """The next event of a watch, failing after ``timeout_s``."""
    return await asyncio.wait_for(anext(events), timeout_s)


def sample_node(name: str, *, port: int = 7000) -> NodeInfo:
    return NodeInfo(node=name, address="127.0.0.1", udp_port=port, tcp_port=port, data_port=port + 1,
                    version="0.1.0", started_at=1_700_000_000.5, pid=os.getpid(), cpus=2)


# Lease timing: TTL 1 s asked; etcd rounds up to ~2 s. Expiry must come within TTL + slack.
TTL_S = 1.0
EXPIRY_BOUND_S = 6.0


class RegistryBackendConformance:
    """KV, leases, keep-alive, watches and CAS, as :class:`RegistryBackend` documents them."""

    def test_put_get_roundtrip_and_versions(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                assert await r.get("a") is None
                rev1 = await r.put("a", b"one")
                rev2 = await r.put("a", b"two")
                assert rev2 > rev1
                got = await r.get("a")
                assert got is not None
                assert got == Entry("a", b"two", 2, rev2, 0)
                rev3 = await r.put("bin", bytes(range(256)))
                assert await r.get("bin") == Entry("bin", bytes(range(256)), 1, rev3)
        run(body())

    def test_prefix_listing_is_sorted_and_bounded(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                for key in ("n/b", "n/a", "n/c/x", "nx", "m"):
                    await r.put(key, key.encode())
                assert [e.key for e in await r.get_prefix("n/")] == ["n/a", "n/b", "n/c/x"]
                assert [e.key for e in await r.get_prefix("")] == ["m", "n/a", "n/b", "n/c/x", "nx"]
                assert await r.get_prefix("zzz") == []
        run(body())

    def test_delete_and_delete_prefix(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                for key in ("d/1", "d/2", "d/3", "e"):
                    await r.put(key, b"x")
                assert await r.delete("d/1") is True
                assert await r.delete("d/1") is False
                assert await r.delete_prefix("d/") == 2
                assert await r.delete_prefix("d/") == 0
                assert [e.key for e in await r.get_prefix("")] == ["e"]
        run(body())

    def test_bad_input_is_rejected_without_side_effects(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                with pytest.raises(TypeError, match="bytes"):
                    await r.put("k", "not bytes")  # type: ignore[arg-type]
                with pytest.raises(ValueError, match="empty"):
                    await r.put("", b"x")
                with pytest.raises(TypeError, match="str"):
                    await r.get(b"k")  # type: ignore[arg-type]
                with pytest.raises(ValueError, match="positive"):
                    await r.grant_lease(0)
                with pytest.raises(ValueError, match="positive"):
                    await r.grant_lease(float("nan"))
                with pytest.raises(ValueError, match="expected"):
                    await r.compare_and_swap("k", b"v")
                with pytest.raises(LeaseNotFound):
                    await r.put("k", b"x", lease=0x5EED_0BAD)
                with pytest.raises(LeaseNotFound):
                    await r.refresh_lease(0x5EED_0BAD)
                assert await r.revoke_lease(0x5EED_0BAD) is False
                assert await r.get_prefix("") == []
        run(body())

    def test_lease_expiry_removes_keys(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                lease = await r.grant_lease(TTL_S)
                await r.put("live/a", b"1", lease=lease)
                await r.put("live/b", b"2", lease=lease)
                await r.put("stay", b"3")
                assert (await r.get("live/a")).lease == lease
                took = await eventually(lambda: _absent(r, "live/"), EXPIRY_BOUND_S, "leased keys expire")
                assert took >= TTL_S * 0.8
                assert await r.get("stay") is not None
                with pytest.raises(LeaseNotFound):
                    await r.refresh_lease(lease)
                with pytest.raises(LeaseNotFound):
                    await r.put("live/c", b"x", lease=lease)
        run(body())

    def test_keep_alive_keeps_keys_until_stopped(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                lease = await r.grant_lease(TTL_S)
                await r.put("ka", b"1", lease=lease)
                ka = r.keep_alive(lease, TTL_S)
                await asyncio.sleep(EXPIRY_BOUND_S * 0.6)  # beyond the (rounded) TTL
                assert await r.get("ka") is not None and ka.running and not ka.lost.is_set()
                await ka.stop()
                await eventually(lambda: _absent(r, "ka"), EXPIRY_BOUND_S, "key expires after stop")
        run(body(), timeout_s=40)

    def test_keep_alive_reports_a_lost_lease(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                lease = await r.grant_lease(TTL_S)
                lost: list[int] = []
                ka = r.keep_alive(lease, TTL_S, on_lost=lambda: lost.append(lease))
                assert await r.revoke_lease(lease) is True
                await asyncio.wait_for(ka.lost.wait(), EXPIRY_BOUND_S)
                assert lost == [lease] and not ka.running
        run(body())

    def test_revoke_deletes_keys_at_once(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                lease = await r.grant_lease(30)
                await r.put("rv", b"1", lease=lease)
                assert await r.revoke_lease(lease) is True
                assert await r.get("rv") is None
        run(body())

    def test_lease_ttl_counts_down_and_refresh_restarts_it(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                lease = await r.grant_lease(30)
                ttl, left = await r.lease_ttl(lease)
                assert ttl >= 30 and ttl - 1.0 <= left <= ttl
                await asyncio.sleep(1.5)  # etcd counts whole seconds
                ttl2, later = await r.lease_ttl(lease)
                assert ttl2 == ttl and later < left and ttl - later >= 1.0
                await r.refresh_lease(lease)
                assert (await r.lease_ttl(lease))[1] > later
                assert await r.revoke_lease(lease) is True
                assert await r.lease_ttl(lease) is None
                assert await r.lease_ttl(0x5EED_0BAD) is None
        run(body())

    def test_watch_sees_puts_deletes_and_expiry(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r, registry_harness.client() as writer:
                async with r.watch_prefix("w/") as events:
                    await writer.put("w/a", b"1")
                    await writer.put("other", b"ignored")
                    await writer.put("w/a", b"2")
                    await writer.delete("w/a")
                    lease = await writer.grant_lease(TTL_S)
                    await writer.put("w/leased", b"3", lease=lease)
                    seen = [await next_event(events) for _ in range(4)]
                    assert [(e.kind, e.key, e.value) for e in seen] == [
                        ("put", "w/a", b"1"), ("put", "w/a", b"2"), ("delete", "w/a", b""),
                        ("put", "w/leased", b"3")]
                    assert [e.revision for e in seen] == sorted(e.revision for e in seen)
                    expired = await next_event(events, EXPIRY_BOUND_S)
                    assert (expired.kind, expired.key) == ("delete", "w/leased")
                # Once the block is left, iteration ends instead of hanging.
                assert [e async for e in events] == []
        run(body())

    def test_create_if_absent_race_has_one_winner(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            clients = [registry_harness.client() for _ in range(4)]
            try:
                leases = [await c.grant_lease(30) for c in clients]
                wins = await asyncio.gather(*(c.create("lock", f"c{i}".encode(), lease=leases[i])
                                              for i, c in enumerate(clients)))
                assert sorted(wins) == [False, False, False, True]
                winner = wins.index(True)
                got = await clients[0].get("lock")
                assert got is not None and got.value == f"c{winner}".encode() and got.lease == leases[winner]
                assert await clients[1].create("lock", b"again") is False
            finally:
                for c in clients:
                    await c.close()
        run(body())

    def test_compare_and_swap_and_delete(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                # An absent key never matches, not even an expected empty value.
                assert await r.compare_and_swap("c", b"x", expected_value=b"") is False
                assert await r.create("c", b"v1") is True
                assert await r.compare_and_swap("c", b"v2", expected_value=b"nope") is False
                assert await r.compare_and_swap("c", b"v2", expected_value=b"v1") is True
                assert await r.compare_and_swap("c", b"v3", expected_version=1) is False
                assert await r.compare_and_swap("c", b"v3", expected_version=2, expected_value=b"v2") is True
                assert (await r.get("c")).value == b"v3"
                assert await r.compare_and_delete("c", expected_value=b"v2") is False
                assert await r.compare_and_delete("c", expected_version=3) is True
                assert await r.get("c") is None
        run(body())


async def _absent(r: RegistryBackend, prefix: str) -> bool:
    return not await r.get_prefix(prefix)


def _engines(name: str) -> dict[str, Any]:
    return {
        "op_engines": [OpEngineInfo(name, "numpy", "numpy", "cpu", ("add", "matmul"), ("float32",),
                                    gflops=12.5, gbps=3.0)],
        "memory_engines": [MemoryEngineInfo(name, "host", "host", 1 << 30, 1 << 29)],
        "bindings": [Binding(name, "numpy", "host")],
    }


class NodeRegistryConformance:
    """The typed layer and leader election over a backend."""

    def test_register_list_and_close(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                reg = await register_node(r, sample_node("n1"), ttl_s=TTL_S, **_engines("n1"))
                assert [n.node for n in await list_nodes(r)] == ["n1"]
                assert await list_nodes(r) == [sample_node("n1")]
                assert [e.ops for e in await list_op_engines(r, "n1")] == [("add", "matmul")]
                await reg.put(MemoryEngineInfo("n1", "host", "host", 1 << 30, 1234))
                assert [m.free for m in await list_memory_engines(r)] == [1234]
                await asyncio.sleep(EXPIRY_BOUND_S * 0.5)  # keep-alive holds it past the TTL
                assert len(await list_nodes(r)) == 1
                await reg.close()
                assert await list_nodes(r) == [] and await r.get_prefix("engines/") == []
        run(body())

    def test_dead_node_disappears_by_itself(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                reg = await register_node(r, sample_node("dying"), ttl_s=TTL_S, **_engines("dying"))
                await reg.abandon()  # as if SIGKILLed: nobody refreshes, nobody deletes
                await eventually(lambda: _absent(r, ""), EXPIRY_BOUND_S, "dead node's keys expire")
        run(body())

    def test_node_records_are_checked(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                with pytest.raises(ValueError, match="does not belong"):
                    await register_node(r, sample_node("a"), **_engines("b"))
                with pytest.raises(ValueError, match="may not contain"):
                    await register_node(r, sample_node("a/b"))
                assert await r.get_prefix("") == []
        run(body())

    def test_malformed_values_are_skipped_with_a_warning(self, registry_harness: RegistryHarness,
                                                          caplog: pytest.LogCaptureFixture) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                await r.put("nodes/good", encode(sample_node("good")))
                await r.put("nodes/junk", b"{not json")
                await r.put("nodes/list", b"[1, 2]")
                await r.put("nodes/typo", encode(sample_node("typo")).replace(b'"pid":', b'"pid":"x","_":'))
                await r.put("nodes/moved", encode(sample_node("elsewhere")))
                await r.put("nodes/binary", b"\xff\xfe")
                with caplog.at_level(logging.WARNING, logger="triplane.registry"):
                    assert [n.node for n in await list_nodes(r)] == ["good"]
                warned = " ".join(rec.getMessage() for rec in caplog.records)
                for key in ("nodes/junk", "nodes/list", "nodes/typo", "nodes/moved", "nodes/binary"):
                    assert key in warned
        run(body())

    def test_watch_nodes_sees_join_and_leave(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as r:
                first = await register_node(r, sample_node("w1"), ttl_s=TTL_S)
                stream = watch_nodes(r)
                try:
                    ev = await asyncio.wait_for(anext(stream), 5)
                    assert (ev.kind, ev.node, ev.info) == ("up", "w1", sample_node("w1"))
                    await r.put("nodes/bad", b"garbage")  # skipped, never ends the stream
                    second = await register_node(r, sample_node("w2"), ttl_s=TTL_S)
                    ev = await asyncio.wait_for(anext(stream), 5)
                    assert (ev.kind, ev.node) == ("up", "w2")
                    await first.close()
                    ev = await asyncio.wait_for(anext(stream), 5)
                    assert (ev.kind, ev.node, ev.info) == ("down", "w1", None)
                    await second.abandon()
                    ev = await asyncio.wait_for(anext(stream), EXPIRY_BOUND_S)
                    assert (ev.kind, ev.node) == ("down", "w2")
                finally:
                    await stream.aclose()
        run(body())

    def test_leader_election_and_failover(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as a, registry_harness.client() as b, \
                    registry_harness.client() as c:
                assert await leader(a) is None
                first = await asyncio.wait_for(campaign(a, "sched-a", TTL_S), 5)
                assert await leader(b) == "sched-a"
                standby = asyncio.create_task(campaign(b, "sched-b", TTL_S))
                await asyncio.sleep(0.3)
                assert not standby.done()
                # The leader dies without resigning: its lease is revoked by someone else.
                await c.revoke_lease(first.lease)
                second = await asyncio.wait_for(standby, EXPIRY_BOUND_S)
                assert await leader(c) == "sched-b"
                await asyncio.wait_for(first.lost.wait(), EXPIRY_BOUND_S)
                # Expiry also hands over: the standby waits while the leader keeps its lease.
                third_task = asyncio.create_task(campaign(c, "sched-c", TTL_S))
                await asyncio.sleep(EXPIRY_BOUND_S * 0.5)
                assert not third_task.done() and await leader(a) == "sched-b"
                await second._keep_alive.stop()  # as if frozen: the lease expires
                third = await asyncio.wait_for(third_task, EXPIRY_BOUND_S)
                assert await leader(a) == "sched-c"
                await third.resign()
                assert await leader(a) is None
                await first.resign()  # resigning a lost leadership is harmless
                assert await a.get(LEADER_KEY) is None
        run(body(), timeout_s=45)

    def test_two_candidates_race_one_leads(self, registry_harness: RegistryHarness) -> None:
        async def body() -> None:
            async with registry_harness.client() as a, registry_harness.client() as b:
                tasks = [asyncio.create_task(campaign(x, name, 30)) for x, name in ((a, "x"), (b, "y"))]
                done, pending = await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
                await asyncio.sleep(0.3)
                assert len(done) == 1 and len(pending) == 1 and not next(iter(pending)).done()
                won = next(iter(done)).result()
                assert await leader(a) == won.candidate_id
                await won.resign()
                runner_up = await asyncio.wait_for(next(iter(pending)), 5)
                assert runner_up.candidate_id != won.candidate_id
                assert await leader(b) == runner_up.candidate_id
                await runner_up.resign()
        run(body())
