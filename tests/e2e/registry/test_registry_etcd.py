"""The registry conformance suite against a real etcd (started here on 127.0.0.1), plus
what only a real server can show: restarts, with and without losing its data."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from triplane.registry import RegistryBackend, connect_registry, list_nodes, register_node, watch_nodes
from triplane.registry.etcd_server import ETCD_APT_PACKAGE, EtcdServer, find_etcd_binary
from triplane.registry.testing import (
    EXPIRY_BOUND_S,
    NodeRegistryConformance,
    RegistryBackendConformance,
    eventually,
    run,
    sample_node,
)

pytest.importorskip("aetcd", reason="the etcd backend needs the 'aetcd' package (pip install aetcd)")
if find_etcd_binary() is None:
    pytest.skip(f"no etcd binary: apt-get install -y {ETCD_APT_PACKAGE}", allow_module_level=True)

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class EtcdHarness:
    def __init__(self, server: EtcdServer) -> None:
        self.server = server
        self.prefix = f"/triplane-test/{next(_prefixes)}/"

    def client(self) -> RegistryBackend:
        return connect_registry(self.server.url, prefix=self.prefix)


class TestEtcdConformance(RegistryBackendConformance, NodeRegistryConformance):
    @pytest.fixture
    def registry_harness(self, etcd: EtcdServer) -> Iterator[EtcdHarness]:
        yield EtcdHarness(etcd)


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test's own, since the test stops and restarts it."""
    server = EtcdServer(tmp_path / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_node_reregisters_after_etcd_loses_its_data(private_etcd: EtcdServer) -> None:
    async def body() -> None:
        async with connect_registry(private_etcd.url) as r:
            reg = await register_node(r, sample_node("survivor"), ttl_s=1)
            stream = watch_nodes(r)
            try:
                assert (await asyncio.wait_for(anext(stream), 5)).kind == "up"
                old_lease = reg.lease
                await asyncio.to_thread(private_etcd.restart, wipe=True, down_s=1.0)
                took = await eventually(lambda: _listed(r, "survivor"), 15, "node registered again")
                assert reg.reregistrations == 1 and reg.lease != old_lease
                assert (await r.get("nodes/survivor")).lease == reg.lease
                # The node never looked down to watchers, and the watch keeps delivering changes
                # (resumed, or re-listed if it noticed the history went backwards).
                late = await register_node(r, sample_node("late"), ttl_s=1)
                ev = await asyncio.wait_for(anext(stream), 15)
                assert (ev.kind, ev.node) == ("up", "late")
                await late.close()
                ev = await asyncio.wait_for(anext(stream), 15)
                assert (ev.kind, ev.node) == ("down", "late")
                print(f"re-registered {took:.2f} s after etcd came back")
            finally:
                await stream.aclose()
                await reg.close()
            assert await list_nodes(r) == []
    run(body(), timeout_s=60)


def test_registration_rides_out_an_etcd_restart(private_etcd: EtcdServer) -> None:
    async def body() -> None:
        async with connect_registry(private_etcd.url) as r:
            reg = await register_node(r, sample_node("steady"), ttl_s=3)
            lease = reg.lease
            async with r.watch_prefix("jobs/") as events:
                await asyncio.to_thread(private_etcd.restart, wipe=False, down_s=0.5)
                await eventually(lambda: _listed(r, "steady"), 10, "registry readable again")
                # etcd keeps leases across a restart: same lease, nothing re-written.
                await asyncio.sleep(EXPIRY_BOUND_S * 0.5)
                assert await _listed(r, "steady") and reg.lease == lease and reg.reregistrations == 0
                # The watch resumed on the restarted server.
                await r.put("jobs/j1", b"1")
                ev = await asyncio.wait_for(anext(events), 10)
                assert (ev.kind, ev.key) == ("put", "jobs/j1")
            await reg.close()
    run(body(), timeout_s=60)


def test_calls_fail_cleanly_while_etcd_is_down(private_etcd: EtcdServer) -> None:
    from triplane.registry import RegistryUnavailable

    async def body() -> None:
        async with connect_registry(private_etcd.url) as r:
            await r.put("k", b"v")
            await asyncio.to_thread(private_etcd.stop)
            with pytest.raises(RegistryUnavailable):
                await r.get("k")
            await asyncio.to_thread(private_etcd.start)
            await eventually(lambda: _has(r, "k"), 10, "etcd answers again")
    run(body(), timeout_s=40)


async def _listed(r: RegistryBackend, node: str) -> bool:
    try:
        return node in [n.node for n in await list_nodes(r)]
    except Exception:
        return False


async def _has(r: RegistryBackend, key: str) -> bool:
    try:
        return await r.get(key) is not None
    except Exception:
        return False
