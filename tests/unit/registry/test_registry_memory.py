"""The registry conformance suite on the in-memory backend, plus memory-only behaviour."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from triplane.registry import LeaseNotFound, MemoryBackend, MemoryStore, RegistryBackend
from triplane.registry.testing import NodeRegistryConformance, RegistryBackendConformance, run

_prefixes = itertools.count()


class MemoryHarness:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.prefix = f"/t{next(_prefixes)}/"

    def client(self) -> RegistryBackend:
        return MemoryBackend(self.store, prefix=self.prefix)


class TestMemoryConformance(RegistryBackendConformance, NodeRegistryConformance):
    @pytest.fixture
    def registry_harness(self) -> Iterator[MemoryHarness]:
        yield MemoryHarness()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_expiry_is_checked_lazily_on_the_injected_clock() -> None:
    async def body() -> None:
        clock = FakeClock()
        r = MemoryBackend(MemoryStore(clock=clock))
        lease = await r.grant_lease(10)
        await r.put("k", b"v", lease=lease)
        clock.now += 9.9
        await r.refresh_lease(lease)  # refreshed just in time: a new 10 s from now
        clock.now += 9.9
        assert await r.get("k") is not None
        clock.now += 0.2
        assert await r.get("k") is None
        with pytest.raises(LeaseNotFound):
            await r.refresh_lease(lease)
        await r.store.close()
    run(body(), timeout_s=5)


def test_prefixes_isolate_clients_of_one_store() -> None:
    async def body() -> None:
        store = MemoryStore()
        a, b = MemoryBackend(store, prefix="/a/"), MemoryBackend(store, prefix="/b/")
        await a.put("k", b"from a")
        assert await b.get("k") is None
        assert [e.key for e in await a.get_prefix("")] == ["k"]
        async with b.watch_prefix("") as events:
            await a.put("k2", b"x")
            await b.put("k3", b"y")
            ev = await asyncio.wait_for(anext(events), 1)
            assert (ev.key, ev.value) == ("k3", b"y")
    run(body(), timeout_s=5)


def test_closing_a_client_ends_its_watches() -> None:
    async def body() -> None:
        r = MemoryBackend()
        watch = r.watch_prefix("")
        await watch.start()
        reader = asyncio.create_task(anext(watch, None))
        await asyncio.sleep(0)
        await r.close()
        assert await asyncio.wait_for(reader, 1) is None
    run(body(), timeout_s=5)


def test_store_survives_a_new_event_loop() -> None:
    store = MemoryStore()

    async def write() -> int:
        r = MemoryBackend(store)
        lease = await r.grant_lease(30)
        await r.put("k", b"v", lease=lease)
        return lease

    async def read(lease: int) -> bytes:
        r = MemoryBackend(store)
        await r.refresh_lease(lease)  # the reaper is re-created on this loop
        got = await r.get("k")
        assert got is not None
        return got.value

    lease = run(write(), timeout_s=5)
    assert run(read(lease), timeout_s=5) == b"v"


def test_a_record_forgotten_or_added_while_a_node_registers_again_does_not_end_its_keep_alive() -> None:
    # The executor's link records come and go while it re-registers after the registry lost
    # its lease (a restarted scheduler serving the registry): the re-registration must still
    # finish and keep the node registered, not die of a dict changed mid-iteration.
    from triplane.registry import register_node
    from triplane.registry.records import Binding, NodeInfo

    class Busy(MemoryBackend):
        reg = None

        async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
            revision = await super().put(key, value, lease)
            if self.reg is not None and key.startswith("bindings/"):
                reg, self.reg = self.reg, None  # once: another record changes meanwhile
                await reg.forget(Binding("n1", "gone", "host"))  # as a link to a peer that left
                await reg.put(Binding("n1", "new", "host"))
            return revision

    async def body() -> None:
        r = Busy()
        node = NodeInfo("n1", "127.0.0.1", 1, 1, 2, "0", 0.0, 1)
        kept, gone = Binding("n1", "e", "host"), Binding("n1", "gone", "host")
        reg = await register_node(r, node, bindings=[gone, kept], ttl_s=0.3)
        await r.revoke_lease(reg.lease)  # the registry lost it
        r.reg = reg
        for _ in range(60):
            await asyncio.sleep(0.05)
            if reg.reregistrations:
                break
        assert reg.reregistrations == 1
        await asyncio.sleep(0.6)  # two TTLs: kept alive under the new lease
        keys = sorted(e.key for e in await r.get_prefix(""))
        assert keys == sorted([node.key(), kept.key(), Binding("n1", "new", "host").key()])
        await reg.close()
    run(body(), timeout_s=10)
