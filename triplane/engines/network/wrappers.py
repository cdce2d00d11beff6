"""Network engines wrapped to misbehave on purpose: for tests and for the conformance kit.

Both are taps on what the wrapped engine puts on the wire (``set_wire``: a datagram for
udp, a whole frame for tcp) and otherwise the engine itself.

* :class:`Lossy` drops, delays (so later units overtake: reordering), duplicates or
  corrupts units at random (seeded): the engine must still deliver every frame intact.
* :class:`Delayed` holds every unit for ``delay_s`` and sends at most ``gbps`` GB/s: a
  slow link from this node, in both directions of its requests and replies.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from triplane.engines.network.base import Handler, NetworkEngine, Tap

__all__ = ["Delayed", "Lossy", "Wrapped"]


class Wrapped:
    """An engine with a tap installed; everything else is the inner engine's, its name
    included (peers find it by that name); ``label`` says what wraps it."""

    def __init__(self, inner: NetworkEngine, label: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.label = label
        self.protocol = inner.protocol
        self.max_frame = inner.max_frame
        inner.set_wire(self._tap)

    def _tap(self, data: bytes, send: Callable[[bytes], None]) -> None:  # pragma: no cover - abstract
        send(data)

    async def serve(self, host: str, handler: Handler, port: int = 0) -> int:
        return await self.inner.serve(host, handler, port)

    async def request(self, address: str, port: int, frame: bytes, *, timeout_s: float = 2.0) -> bytes:
        return await self.inner.request(address, port, frame, timeout_s=timeout_s)

    def set_wire(self, tap: Tap | None) -> None:
        raise RuntimeError(f"{self.label}: the wire of a wrapped engine is the wrapper's")

    async def close(self) -> None:
        await self.inner.close()


class Lossy(Wrapped):
    """Loses ``loss``, reorders ``reorder`` (held up to ``jitter_s``), duplicates
    ``duplicate`` and corrupts ``corrupt`` of the units (fractions 0..1), seeded."""

    def __init__(self, inner: NetworkEngine, *, loss: float = 0.1, reorder: float = 0.2,
                 duplicate: float = 0.05, corrupt: float = 0.0, jitter_s: float = 0.02,
                 seed: int = 0) -> None:
        for what, v in (("loss", loss), ("reorder", reorder), ("duplicate", duplicate), ("corrupt", corrupt)):
            if not 0.0 <= v < 1.0:
                raise ValueError(f"{what} must be in [0, 1), got {v!r}")
        self.loss, self.reorder, self.duplicate, self.corrupt = loss, reorder, duplicate, corrupt
        self.jitter_s = jitter_s
        self.rng = random.Random(seed)
        self.counts = {"sent": 0, "lost": 0, "reordered": 0, "duplicated": 0, "corrupted": 0}
        super().__init__(inner, f"lossy({inner.name})")

    def _tap(self, data: bytes, send: Callable[[bytes], None]) -> None:
        r = self.rng
        self.counts["sent"] += 1
        if r.random() < self.loss:
            self.counts["lost"] += 1
            return
        if r.random() < self.corrupt and len(data) > 40:
            self.counts["corrupted"] += 1
            i = r.randrange(len(data) - 8, len(data))  # in the payload, past any header
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        copies = 2 if r.random() < self.duplicate else 1
        self.counts["duplicated"] += copies - 1
        for _ in range(copies):
            if r.random() < self.reorder:
                self.counts["reordered"] += 1
                asyncio.get_running_loop().call_later(r.uniform(0, self.jitter_s), send, data)
            else:
                send(data)


class Delayed(Wrapped):
    """Holds each unit ``delay_s`` and paces them at ``gbps`` GB/s (None: no pacing)."""

    def __init__(self, inner: NetworkEngine, *, delay_s: float = 0.02, gbps: float | None = None) -> None:
        if delay_s < 0 or (gbps is not None and gbps <= 0):
            raise ValueError(f"delay_s must be >= 0 and gbps > 0, got {delay_s!r}, {gbps!r}")
        self.delay_s, self.gbps = delay_s, gbps
        self._busy_until = 0.0
        super().__init__(inner, f"delayed({inner.name})")

    def _tap(self, data: bytes, send: Callable[[bytes], None]) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = max(now, self._busy_until)
        if self.gbps is not None:
            self._busy_until = start + len(data) / (self.gbps * 1e9)
        else:
            self._busy_until = start
        loop.call_at(self._busy_until + self.delay_s, send, data)

