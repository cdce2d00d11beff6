"""Measuring a pair of nodes through a network engine: a bounded probe.

A peer serves :func:`probe_handler` on its network engine. :func:`measure` asks it
``pings`` tiny frames (latency: the best round trip, µs) and ``rounds`` bulk frames of
``nbytes`` each answered by two bytes (bandwidth: bytes over the best bulk time less the
best round trip, GB/s). What it sends is bounded: ``pings * 9 + rounds * nbytes`` bytes,
and the whole probe by ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from triplane.engines.network.base import NetworkEngine, NetworkEngineError

__all__ = ["PROBE_BYTES", "Measured", "measure", "ping", "probe_handler"]

PROBE_BYTES = 256 * 1024
_PING, _BULK = b"P", b"B"


async def probe_handler(frame: bytes) -> bytes:
    """What a node answers on its network engines: a ping echoed, a bulk frame acknowledged."""
    if frame[:1] == _BULK:
        return b"ok"
    return frame[:64]


@dataclass(frozen=True)
class Measured:
    """A pair's figures: bandwidth (GB/s, 1e9 bytes) and latency (µs, best round trip)."""

    bandwidth_gbps: float
    latency_us: float


async def ping(engine: NetworkEngine, address: str, port: int, *, timeout_s: float = 1.0) -> float:
    """One round trip of a tiny frame, in µs."""
    t = time.perf_counter()
    reply = await engine.request(address, port, _PING + b"12345678", timeout_s=timeout_s)
    if reply != _PING + b"12345678":
        raise NetworkEngineError(f"{address}:{port} answered a ping with {reply[:16]!r}")
    return (time.perf_counter() - t) * 1e6


async def measure(engine: NetworkEngine, address: str, port: int, *, nbytes: int = PROBE_BYTES,
                  pings: int = 5, rounds: int = 3, timeout_s: float = 5.0) -> Measured:
    """Latency and bandwidth from here to ``address:port`` (see the module doc).
    NetworkEngineError if the peer does not answer within ``timeout_s`` in all."""
    if pings < 1 or rounds < 1 or nbytes < 1:
        raise ValueError("pings, rounds and nbytes must be >= 1")
    nbytes = min(nbytes, engine.max_frame)

    async def run() -> Measured:
        best = min([await ping(engine, address, port, timeout_s=timeout_s) for _ in range(pings)])
        bulk = _BULK + bytes(nbytes - 1)
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            if await engine.request(address, port, bulk, timeout_s=timeout_s) != b"ok":
                raise NetworkEngineError(f"{address}:{port} did not acknowledge a bulk frame")
            times.append(time.perf_counter() - t)
        secs = max(min(times) - best * 1e-6 / 2, 1e-7)
        return Measured(nbytes / secs / 1e9, best)

    try:
        return await asyncio.wait_for(run(), timeout_s)
    except TimeoutError:
        raise NetworkEngineError(f"probe of {address}:{port} took over {timeout_s:g} s") from None
