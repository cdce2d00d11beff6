"""Executors measure each peer through their network engines and publish the pairs.

Three executors in this process share an in-memory registry; one of them delays every
frame of its network engines by 30 ms (``network_delay_ms``: the slowed peer). Real
sockets on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from plugin_sites import write_network_plugins

from triplane.engines.network.measure import probe_handler
from triplane.engines.network.tcp import TcpEngine
from triplane.engines.network.wrappers import Delayed
from triplane.executor.daemon import Executor
from triplane.executor.links import LinkProber
from triplane.registry import (
    LinkInfo,
    MemoryBackend,
    MemoryStore,
    NetworkEngineInfo,
    NodeInfo,
    list_links,
    list_network_engines,
    register_node,
)
from triplane.scheduler.cluster import figures_from_registry

SECRET = b"links-test-secret"
DELAY_MS = 30.0


async def _wait_links(backend: MemoryBackend, want: int, timeout_s: float = 20.0) -> list[LinkInfo]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        links = await list_links(backend)
        if len(links) >= want or loop.time() > deadline:
            return links
        await asyncio.sleep(0.1)


def test_executors_publish_per_pair_figures_and_the_slowed_peer_shows() -> None:
    async def go() -> None:
        store = MemoryStore()
        execs = [Executor(MemoryBackend(store), SECRET, memory_bytes=64 << 20, name=name, benchmark_size=64,
                          link_interval_s=0.2, network_delay_ms=DELAY_MS if name == "slow" else 0.0)
                 for name in ("a", "b", "slow")]
        for e in execs:
            await e.start()
        try:
            backend = MemoryBackend(store)
            nets = await list_network_engines(backend)
            want = {(x, p) for x in ("a", "b", "slow") for p in ("tcp", "udp")}
            assert {(n.node, n.engine) for n in nets} == want
            assert all(n.port > 0 for n in nets)
            links = await _wait_links(backend, 6)
            pairs = {(ln.node, ln.peer): ln for ln in links}
            assert set(pairs) == {(x, y) for x in ("a", "b", "slow") for y in ("a", "b", "slow") if x != y}
            for (src, dst), ln in pairs.items():
                slowed = "slow" in (src, dst)
                # a round trip through the slowed engine waits at least once for its delay
                assert (ln.latency_us >= DELAY_MS * 1e3) == slowed, (src, dst, ln)
                assert ln.engine == "tcp" and ln.bandwidth_gbps > 0
            figs = {f.name: f for f in await figures_from_registry(backend)}
            assert figs["a"].link("b") is not None and figs["a"].link("slow")[1] >= DELAY_MS * 1e3
            # bounded: a few full probes per peer, each 3 x 256 KiB
            for e in execs:
                assert e.links is not None and e.links.bytes_sent <= 4 * 2 * 3 * (256 << 10)
        finally:
            for e in execs:
                await e.stop()
        assert await list_links(MemoryBackend(store)) == []  # leased with their nodes

    asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("engine_name", ["tcp"])
def test_a_pair_is_measured_again_when_its_latency_drifts(engine_name: str) -> None:
    async def go() -> None:
        store = MemoryStore()
        backend = MemoryBackend(store)
        peer_engine = Delayed(TcpEngine(), delay_s=0.0)
        port = await peer_engine.serve("127.0.0.1", probe_handler)
        peer = await register_node(backend, NodeInfo("p", "127.0.0.1", 1, 1, 1, "0", 0.0, 1))
        await peer.put(NetworkEngineInfo("p", "tcp", "tcp", 1.0, 1.0, port))
        me = await register_node(backend, NodeInfo("m", "127.0.0.1", 1, 1, 1, "0", 0.0, 1))
        mine = TcpEngine()
        prober = LinkProber("m", mine, backend, lambda: me, min_gap_s=0.0, refresh_s=3600)
        try:
            first = await prober.round()
            assert [ln.peer for ln in first] == ["p"] and first[0].latency_us < 20_000
            assert await prober.round() == []  # no drift: pings only, nothing re-measured
            peer_engine.delay_s = 0.02  # the link slows down
            again = await prober.round()
            assert [ln.peer for ln in again] == ["p"] and again[0].latency_us >= 20_000
            assert (await list_links(backend))[0].latency_us >= 20_000
            await peer.close()  # the peer leaves: its link goes
            assert await prober.round() == [] and await list_links(backend) == []
        finally:
            await prober.engine.close()
            await peer_engine.close()
            await me.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_an_executor_refuses_a_network_engine_that_is_not_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from triplane.engines import registry

    monkeypatch.setitem(registry.BUILTINS["network"], "bogus", "builtins:object")
    with pytest.raises(TypeError, match=r"network engine 'bogus' \(object\) does not implement the "
                                        r"NetworkEngine protocol: name: missing"):
        Executor(MemoryBackend(), SECRET, memory_bytes=1 << 20, network_engines=("bogus",))


def test_the_network_engine_named_measures_the_links_and_a_bad_one_is_isolated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(write_network_plugins(tmp_path / "site")))  # entry points only

    async def go() -> None:
        store = MemoryStore()
        execs = [Executor(MemoryBackend(store), SECRET, memory_bytes=64 << 20, name=name, benchmark_size=64,
                          link_interval_s=0.2, network_engines=(first, "tcp", "udp"))
                 for name, first in (("a", "slowtcp"), ("b", "slowtcp"), ("c", "nodriver"))]
        for e in execs:
            await e.start()
        try:
            backend = MemoryBackend(store)
            served = {(n.node, n.engine) for n in await list_network_engines(backend)}
            assert {("a", "slowtcp"), ("b", "slowtcp"), ("c", "tcp")} <= served
            assert ("c", "nodriver") not in served
            links = await _wait_links(backend, 4)
            pairs = {(ln.node, ln.peer): ln for ln in links}
            for src, dst in (("a", "b"), ("b", "a")):  # through the plugin: 30 ms each way, at least
                assert pairs[src, dst].engine == "slowtcp" and pairs[src, dst].latency_us >= DELAY_MS * 1e3
            assert {pairs["c", p].engine for p in ("a", "b")} == {"tcp"}  # its plugin isolated: tcp measures
            assert pairs["c", "a"].latency_us < DELAY_MS * 1e3
            problems = execs[2].stats()["plugins"]
            assert [(p["kind"], p["name"]) for p in problems] == [("network", "nodriver")]
            assert "libverbs.so.1 not found" in problems[0]["message"]
        finally:
            for e in execs:
                await e.stop()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_an_unknown_network_engine_is_a_usage_error_listing_the_known(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from triplane.executor.cli import run_executor

    monkeypatch.setenv("TRIPLANE_SECRET", SECRET.decode() * 2)
    assert run_executor("memory://", network_engine="rdma") == 2
    err = capsys.readouterr().err
    assert "unknown network engine 'rdma' (known: [" in err and "'tcp'" in err, err
