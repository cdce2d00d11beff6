"""Limits every TCP port of a node holds to (docs/packets.md, "Limits on every port").

A stranger can open connections and send bytes; until a frame's tag has been checked
those bytes are untrusted, so what they may cost is bounded here:

* **connections**: at most ``max_connections`` open at once per port; one more is closed at
  once (``refused`` counts them);
* **idle time**: a connection that does not complete its next frame within
  ``idle_timeout`` seconds (a half-open one, one that sent two header bytes and stopped,
  one that dribbles) is closed (``idle_closed``);
* **bytes in flight**: frame payloads being received, summed over the port's
  connections, stay under ``max_bytes_in_flight``; a frame that would go over it closes
  its connection (``over_budget``).

``ConnectionGuard`` is the shared counter a server consults (pure bookkeeping);
``next_frame`` reads one packet frame from a stream within those limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from triplane.proto.packet import PacketMalformed
from triplane.proto.packet.transport import frame_length

__all__ = ["DEFAULT_LIMITS", "ConnectionGuard", "Limits", "next_frame"]



@dataclass(frozen=True)
class Limits:
    """The limits of one listening port (defaults in ``DEFAULT_LIMITS``)."""

    idle_timeout: float = 10.0
    max_connections: int = 256
    max_bytes_in_flight: int = 64 << 20

    def __post_init__(self) -> None:
        if self.idle_timeout <= 0 or self.max_connections < 1 or self.max_bytes_in_flight < 1:
            raise ValueError(f"limits must be positive: {self}")


DEFAULT_LIMITS = Limits()


@dataclass
class ConnectionGuard:
    """Connections and bytes in flight on one port, against ``limits``."""

    limits: Limits = DEFAULT_LIMITS
    open: int = 0
    in_flight: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {
        "accepted": 0, "refused": 0, "idle_closed": 0, "over_budget": 0})

    def admit(self) -> bool:
        """Count a new connection in; False (and counted as refused) over the cap: the
        caller closes it without reading."""
        if self.open >= self.limits.max_connections:
            self.counts["refused"] += 1
            return False
        self.open += 1
        self.counts["accepted"] += 1
        return True

    def leave(self) -> None:
        """A connection admitted by ``admit`` closed."""
        self.open -= 1

    def take(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` of the in-flight budget for a frame being received; False
        (counted) when it would go over: the caller closes the connection."""
        if self.in_flight + nbytes > self.limits.max_bytes_in_flight:
            self.counts["over_budget"] += 1
            return False
        self.in_flight += nbytes
        return True

    def give(self, nbytes: int) -> None:
        """Return what ``take`` reserved, once the frame was handled."""
        self.in_flight -= nbytes

    def idle(self) -> None:
        """Count a connection closed for idling."""
        self.counts["idle_closed"] += 1

    def stats(self) -> dict[str, int]:
        return {**self.counts, "open": self.open, "bytes_in_flight": self.in_flight}


async def next_frame(reader: asyncio.StreamReader, guard: ConnectionGuard, max_bytes: int, *,
                     busy: Callable[[], bool] = lambda: False) -> bytes | None:
    """The next frame payload (4-byte big-endian length, then that many bytes; the packet
    transport's framing) from ``reader``, held to ``guard``'s limits. None when the
    connection is to be closed: a clean end of stream, no complete header within the idle
    timeout (unless ``busy()``: the connection is waiting for replies to tasks it brought),
    a payload not complete within it, or over the byte budget. A header announcing 0 or
    more than ``max_bytes`` bytes raises ``PacketMalformed``/``PacketTooLarge`` (the stream
    lost sync). Only the length is looked at: what the payload is, is the caller's to check
    (the signature first)."""
    idle_s = guard.limits.idle_timeout
    while True:
        try:
            # Cancelled while waiting, readexactly consumes nothing: waiting again is safe.
            head = await asyncio.wait_for(reader.readexactly(4), idle_s)
            break
        except asyncio.TimeoutError:
            if busy():
                continue
            guard.idle()
            return None
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise PacketMalformed("stream ended inside a frame header") from None
            return None
    n = frame_length(head, max_bytes)
    if not guard.take(n):
        return None
    try:
        return await asyncio.wait_for(reader.readexactly(n), idle_s)
    except asyncio.TimeoutError:
        guard.idle()
        return None
    except asyncio.IncompleteReadError:
        raise PacketMalformed(f"stream ended inside a frame of {n} bytes") from None
    finally:
        guard.give(n)
