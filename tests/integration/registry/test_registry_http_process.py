"""The HTTP-served registry over real loopback sockets: ``python -m triplane.registry.http``
(uvicorn) in a subprocess serving the conformance suite, restarted under a live node, and a
SIGKILLed node process vanishing with its lease.

Every process started here is killed in a ``finally``; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the served registry needs fastapi (pip install 'triplane[cluster]')")
pytest.importorskip("uvicorn", reason="the served registry needs uvicorn (pip install 'triplane[cluster]')")

from triplane.registry import (
    LeaseNotFound,
    RegistryUnavailable,
    connect_registry,
    list_nodes,
    register_node,
    watch_nodes,
)
from triplane.registry.credential import node_credential
from triplane.registry.http import HttpBackend
from triplane.registry.testing import (
    EXPIRY_BOUND_S,
    TTL_S,
    NodeRegistryConformance,
    RegistryBackendConformance,
    eventually,
    run,
    sample_node,
)

SECRET = "integration-secret-0123456789"
TOKEN = node_credential(SECRET)  # what the server derives from $TRIPLANE_SECRET
REPO = Path(__file__).resolve().parents[3]
_prefixes = itertools.count()


class LoopbackHarness:
    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"/t{next(_prefixes)}/"

    def client(self) -> HttpBackend:
        return HttpBackend(self.url, TOKEN, prefix=self.prefix, poll_s=2)


class TestHttpLoopbackConformance(RegistryBackendConformance, NodeRegistryConformance):
    @pytest.fixture
    def registry_harness(self, server_process: ServerProcess) -> Iterator[LoopbackHarness]:
        yield LoopbackHarness(server_process.url)


def test_wrong_token_over_the_wire_is_refused(server_process: ServerProcess) -> None:
    async def body() -> None:
        async with HttpBackend(server_process.url, "not-the-token") as bad, \
                HttpBackend(server_process.url, TOKEN, prefix="/auth/") as good:
            with pytest.raises(PermissionError, match="401"):
                await bad.put("/auth/k", b"v")
            assert await good.get("k") is None
    run(body(), timeout_s=10)


# -- the registry server as its own process -------------------------------------------------

def _env() -> dict[str, str]:
    env = dict(os.environ, TRIPLANE_SECRET=SECRET, PYTHONPATH=str(REPO))
    env.pop("TRIPLANE_TOKEN", None)
    return env


class ServerProcess:
    """``python -m triplane.registry.http`` on a loopback port (ephemeral the first time)."""

    def __init__(self, port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triplane.registry.http", "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=REPO, text=True)
        self.url = json.loads(_read_line(self.proc, 20))["url"]
        self.port = int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The child's first stdout line, or a failure carrying its stderr (bounded wait)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline() if proc.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0]:
        proc.kill()
        _, err = proc.communicate(timeout=5)
        raise AssertionError(f"child printed nothing within {timeout_s} s; stderr:\n{err}")
    return box[0]


@pytest.fixture(scope="module")
def server_process() -> Iterator[ServerProcess]:
    """One registry server process for the conformance suite (clients use distinct prefixes)."""
    server = ServerProcess()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Everything a test starts goes here and is SIGKILLed at teardown, pass or fail."""
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


NODE_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from triplane.registry import connect_registry, register_node
    from triplane.registry.testing import sample_node

    async def main():
        reg = connect_registry(sys.argv[1])          # credential from $TRIPLANE_SECRET
        await register_node(reg, sample_node(sys.argv[2]), ttl_s=float(sys.argv[3]))
        print("registered", flush=True)
        await asyncio.sleep(120)                     # until SIGKILLed (the test bounds it)

    asyncio.run(main())
""")


def test_sigkilled_node_disappears_after_its_lease_ttl(processes: list[subprocess.Popen[str]]) -> None:
    server = ServerProcess()
    processes.append(server.proc)
    node = subprocess.Popen([sys.executable, "-c", NODE_SCRIPT, server.url, "victim", str(TTL_S)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=REPO, text=True)
    processes.append(node)
    assert _read_line(node, 20).strip() == "registered"

    async def body() -> float:
        async with connect_registry(server.url, token=TOKEN) as r:
            assert [n.node for n in await list_nodes(r)] == ["victim"]
            await asyncio.sleep(TTL_S * 2)  # the node's keep-alive holds it past its TTL
            assert [n.node for n in await list_nodes(r)] == ["victim"]
            node.send_signal(signal.SIGKILL)
            node.wait(5)
            return await eventually(lambda: _no_nodes(r), EXPIRY_BOUND_S, "the killed node's lease expires")
    took = run(body(), timeout_s=30)
    assert took <= TTL_S + 1.0, f"the node vanished {took:.2f} s after SIGKILL (TTL {TTL_S} s)"
    print(f"\nSIGKILLed node gone from the served registry after {took:.2f} s (TTL {TTL_S} s)")


async def _no_nodes(r: HttpBackend) -> bool:
    return not await list_nodes(r)


def test_server_restart_unavailable_then_recovery(processes: list[subprocess.Popen[str]]) -> None:
    """The registry process dies (state lost) and comes back on the same port: calls raise
    RegistryUnavailable meanwhile; afterwards the node re-registers itself, a stale lease is
    LeaseNotFound, and watch_nodes converges by re-listing."""
    server = ServerProcess()
    processes.append(server.proc)

    async def body() -> None:
        async with HttpBackend(server.url, TOKEN, timeout_s=1.0, poll_s=1.0) as r, \
                HttpBackend(server.url, TOKEN, timeout_s=1.0) as node_side:
            reg = await register_node(node_side, sample_node("n1"), ttl_s=TTL_S)
            old_lease = reg.lease
            stream = watch_nodes(r, retry_s=0.2)
            try:
                ev = await asyncio.wait_for(anext(stream), 5)
                assert (ev.kind, ev.node) == ("up", "n1")
                server.kill()
                with pytest.raises(RegistryUnavailable):
                    await r.get("nodes/n1")
                with pytest.raises(RegistryUnavailable):
                    await r.grant_lease(5)
                restarted = ServerProcess(server.port)
                processes.append(restarted.proc)
                assert restarted.url == server.url
                # Back with an empty store: the keep-alive finds its lease gone and writes again.
                async def back() -> bool:
                    return reg.reregistrations >= 1 and await _has(r, "n1")
                await eventually(back, 10, "n1 re-registered after the restart")
                assert reg.lease != old_lease
                with pytest.raises(LeaseNotFound):
                    await r.refresh_lease(old_lease)
                # The watch lost its history (410); watch_nodes re-lists, finds n1 unchanged
                # (so says nothing of it) and goes on watching the new server.
                reg2 = await register_node(node_side, sample_node("n2"), ttl_s=TTL_S)
                ev = await asyncio.wait_for(anext(stream), 10)
                assert (ev.kind, ev.node) == ("up", "n2")
                await reg.close()
                ev = await asyncio.wait_for(anext(stream), 5)
                assert (ev.kind, ev.node) == ("down", "n1")
                await reg2.close()
            finally:
                await stream.aclose()
                await reg.abandon()
    run(body(), timeout_s=45)


async def _has(r: HttpBackend, name: str) -> bool:
    try:
        return name in [n.node for n in await list_nodes(r)]
    except RegistryUnavailable:
        return False


def test_standalone_server_refuses_to_start_without_a_credential(tmp_path: Path) -> None:
    env = _env()
    env.pop("TRIPLANE_SECRET")
    done = subprocess.run([sys.executable, "-m", "triplane.registry.http", "--port", "0"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=30)
    assert done.returncode == 2 and "no credential" in done.stderr
