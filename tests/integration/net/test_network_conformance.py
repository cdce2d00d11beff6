"""The network conformance kit on the built-in engines (udp, tcp) and on a broken one:
frames intact under loss and reordering, real sockets on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from triplane.engines.network.tcp import TcpEngine
from triplane.engines.network.testing import NetworkEngineConformance, check_engine
from triplane.engines.network.udp import UdpEngine
from triplane.engines.network.wrappers import Wrapped


class TestTcp(NetworkEngineConformance):
    @pytest.fixture
    def make_network_engine(self) -> Any:
        return TcpEngine


class TestUdp(NetworkEngineConformance):
    @pytest.fixture
    def make_network_engine(self) -> Any:
        return UdpEngine


class _DropsLastByte(Wrapped):
    """A broken engine: every reply loses its last byte after the checksum passed."""

    def __init__(self) -> None:
        super().__init__(TcpEngine(), "drops-last-byte")

    async def request(self, address: str, port: int, frame: bytes, *, timeout_s: float = 2.0) -> bytes:
        reply = await self.inner.request(address, port, frame, timeout_s=timeout_s)
        return reply[:-1]


def test_the_kit_names_what_a_broken_engine_gets_wrong() -> None:
    checks = {c.name: c for c in check_engine(_DropsLastByte)}
    assert not checks["frames intact"].ok
    assert "1000-byte frame came back as 999 bytes" in checks["frames intact"].detail
    assert not checks["loss+reordering"].ok
    assert checks["protocol"].ok and checks["oversize refused"].ok


def test_the_kit_runs_from_the_command_line() -> None:
    out = subprocess.run([sys.executable, "-m", "triplane.engines.network.testing", "--engine", "tcp"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "loss+reordering    pass" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "triplane.engines.network.testing", "--engine", "rdma"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown network engine 'rdma'" in bad.stderr


def test_tcp_asks_a_peer_over_one_connection() -> None:
    import asyncio

    async def go() -> None:
        async def echo(frame: bytes) -> bytes:
            return frame

        server, client = TcpEngine(), TcpEngine()
        port = await server.serve("127.0.0.1", echo)
        try:
            frames = [bytes([i]) * 1000 for i in range(32)]
            assert await asyncio.gather(*[client.request("127.0.0.1", port, f) for f in frames]) == frames
            assert len(server._served) == 1 and len(client._conns) == 1
        finally:
            await client.close()
            await server.close()

    asyncio.run(asyncio.wait_for(go(), 20))
