"""The network-engine conformance kit: run it against your engine.

Each check runs a server and a client engine of the kind on 127.0.0.1 and says pass or
fail with what went wrong. Frames must come back intact (byte for byte) when sent plain,
many at once, and under loss, reordering, duplication and corruption (both ends wrapped
in :class:`~triplane.engines.network.wrappers.Lossy`); a request with no reply and an
oversize frame must fail with :class:`~triplane.engines.network.base.NetworkEngineError`;
the pair probe must give positive figures. From a shell::

    python -m triplane.engines.network.testing --engine tcp

A vendor's test suite reuses the pytest mixin with a fixture that makes an engine::

    from triplane.engines.network.testing import NetworkEngineConformance

    class TestMyEngine(NetworkEngineConformance):
        @pytest.fixture
        def make_network_engine(self):
            return lambda: MyEngine()
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from triplane.engines.checks import Check, check_table
from triplane.engines.errors import UnknownEngineError
from triplane.engines.network.base import NetworkEngine, NetworkEngineError
from triplane.engines.network.measure import measure, probe_handler
from triplane.engines.network.wrappers import Lossy
from triplane.engines.protocols import mismatches

__all__ = ["CHECKS", "Check", "NetworkEngineConformance", "check_engine", "main", "table"]

Make = Callable[[], Any]
SIZES = (0, 1, 1000, 40_000, 300_000)
_HOST = "127.0.0.1"


async def _echo(frame: bytes) -> bytes:
    return frame


def _frames(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(n) for n in SIZES]


async def _pair(make: Make, wrap: Callable[[Any, int], Any] | None = None,
                handler: Callable[[bytes], Awaitable[bytes | None]] = _echo) -> tuple[Any, Any, int]:
    server, client = make(), make()
    if wrap is not None:
        server, client = wrap(server, 1), wrap(client, 2)
    port = await server.serve(_HOST, handler)
    return server, client, port


async def _intact(client: Any, port: int, frames: list[bytes], timeout_s: float) -> str:
    got = await asyncio.gather(*[client.request(_HOST, port, f, timeout_s=timeout_s) for f in frames])
    bad = [f"{len(f)}-byte frame came back as {len(g)} bytes{' (altered)' if len(f) == len(g) else ''}"
           for f, g in zip(frames, got) if f != g]
    return "; ".join(bad)


async def check_protocol(make: Make) -> str:
    problems = mismatches(make(), NetworkEngine)
    return "; ".join(problems)


async def check_frames_intact(make: Make) -> str:
    server, client, port = await _pair(make)
    try:
        return await _intact(client, port, _frames(1), 5.0)
    finally:
        await client.close()
        await server.close()


async def check_many_in_flight(make: Make) -> str:
    server, client, port = await _pair(make)
    try:
        frames = [i.to_bytes(4, "big") * (1 + i * 97) for i in range(32)]
        return await _intact(client, port, frames, 5.0)
    finally:
        await client.close()
        await server.close()


async def check_loss_and_reordering(make: Make) -> str:
    def lossy(engine: Any, seed: int) -> Lossy:
        return Lossy(engine, loss=0.2, reorder=0.3, duplicate=0.1, corrupt=0.05, seed=seed)

    server, client, port = await _pair(make, lossy)
    try:
        bad = await _intact(client, port, _frames(2) * 3, 20.0)
        faults = {k: server.counts[k] + client.counts[k] for k in ("lost", "reordered", "duplicated")}
        if not bad and min(faults.values()) == 0:
            return f"the wrapper injected too few faults to tell: {faults}"
        return bad
    finally:
        await client.close()
        await server.close()


async def check_no_reply_fails(make: Make) -> str:
    async def silent(frame: bytes) -> None:
        return None

    server, client, port = await _pair(make, handler=silent)
    try:
        t = time.perf_counter()
        try:
            await client.request(_HOST, port, b"hello", timeout_s=0.5)
        except NetworkEngineError:
            took = time.perf_counter() - t
            return "" if took < 2.0 else f"gave up after {took:.1f} s for a 0.5 s timeout"
        return "a request nobody answered returned"
    finally:
        await client.close()
        await server.close()


async def check_oversize_refused(make: Make) -> str:
    server, client, port = await _pair(make)
    try:
        try:
            await client.request(_HOST, port, bytes(client.max_frame + 1), timeout_s=1.0)
        except NetworkEngineError:
            return ""
        return f"a frame over max_frame ({client.max_frame}) was carried"
    finally:
        await client.close()
        await server.close()


async def check_probe(make: Make) -> str:
    server, client, port = await _pair(make, handler=probe_handler)
    try:
        m = await measure(client, _HOST, port, nbytes=64 << 10, timeout_s=5.0)
        return "" if m.bandwidth_gbps > 0 and m.latency_us > 0 else f"non-positive figures {m}"
    finally:
        await client.close()
        await server.close()


CHECKS: dict[str, Callable[[Make], Awaitable[str]]] = {
    "protocol": check_protocol,
    "frames intact": check_frames_intact,
    "32 in flight": check_many_in_flight,
    "loss+reordering": check_loss_and_reordering,
    "no reply fails": check_no_reply_fails,
    "oversize refused": check_oversize_refused,
    "pair probe": check_probe,
}


def check_engine(make: Make | str) -> list[Check]:
    """Every check against ``make`` (a factory of engines, or an engine name the registry
    knows); each ends in its own event loop, bounded at 30 s."""
    if isinstance(make, str):
        from triplane.engines.registry import engine_factory

        make = engine_factory("network", make)
    out = []
    for name, fn in CHECKS.items():
        t = time.perf_counter()
        try:
            detail = asyncio.run(asyncio.wait_for(fn(make), 30.0))
        except Exception as e:  # an engine that raises fails the check, it does not stop the kit
            detail = f"{type(e).__name__}: {e}"
        out.append(Check(name, not detail, detail, time.perf_counter() - t))
    return out


def table(engine: str, checks: list[Check]) -> str:
    """The checks as a text table (one row each)."""
    return check_table(f"conformance of network engine {engine!r}", checks)


def main(argv: list[str] | None = None) -> int:
    """``python -m triplane.engines.network.testing --engine NAME``: 0 if every check passed."""
    parser = argparse.ArgumentParser(prog="python -m triplane.engines.network.testing")
    parser.add_argument("--engine", action="append", required=True, help="network engine name (repeatable)")
    args = parser.parse_args(argv)
    ok = True
    for name in args.engine:
        try:
            checks = check_engine(name)
        except UnknownEngineError as e:
            print(f"triplane network kit: {e}", file=sys.stderr)
            return 2
        print(table(name, checks))
        ok = ok and all(c.ok for c in checks)
    return 0 if ok else 1


class NetworkEngineConformance:
    """A pytest mixin: subclass it and provide a ``make_network_engine`` fixture (a
    callable taking no argument that makes a new engine)."""

    def _run(self, name: str, make: Make) -> None:
        detail = asyncio.run(asyncio.wait_for(CHECKS[name](make), 30.0))
        assert not detail, f"{name}: {detail}"

    def test_implements_the_protocol(self, make_network_engine: Make) -> None:
        self._run("protocol", make_network_engine)

    def test_frames_come_back_intact(self, make_network_engine: Make) -> None:
        self._run("frames intact", make_network_engine)

    def test_many_requests_in_flight(self, make_network_engine: Make) -> None:
        self._run("32 in flight", make_network_engine)

    def test_frames_intact_under_loss_and_reordering(self, make_network_engine: Make) -> None:
        self._run("loss+reordering", make_network_engine)

    def test_a_request_nobody_answers_fails_in_time(self, make_network_engine: Make) -> None:
        self._run("no reply fails", make_network_engine)

    def test_an_oversize_frame_is_refused(self, make_network_engine: Make) -> None:
        self._run("oversize refused", make_network_engine)

    def test_the_pair_probe_measures(self, make_network_engine: Make) -> None:
        self._run("pair probe", make_network_engine)


if __name__ == "__main__":
    sys.exit(main())
