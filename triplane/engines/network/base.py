"""The network-engine contract: a frame goes to a peer and its reply comes back, intact.

A network engine moves *frames* (bytes, at most ``max_frame`` of them) between nodes as
request and reply. The executor serves a handler on each of its network engines and asks
its peers through them (measuring each pair: :mod:`triplane.engines.network.measure`).

* ``await serve(host, handler, port=0) -> port``: listen on ``host`` and answer each
  request frame with ``await handler(frame)``; a handler returning None sends no reply
  (the asker retries).
* ``await request(address, port, frame, timeout_s=...) -> reply``: the reply frame, intact
  (checksummed), or :class:`NetworkEngineError` when none came within ``timeout_s``. A
  request may reach the handler more than once (a retry after a lost reply): handlers
  are idempotent.
* ``set_wire(tap)``: what the engine puts on the wire (a datagram for udp, a whole frame
  for tcp) goes through ``tap(data, send)``, which calls ``send`` now, later, twice,
  never, or with other bytes. The default sends at once. The wrappers of
  :mod:`triplane.engines.network.wrappers` (loss and reordering, delay) are taps.
* ``await close()`` stops serving and drops connections; idempotent.

Made by the engine registry as ``cls(**options)`` (``udp``, ``tcp``, or a plugin of the
entry-point group ``triplane.engines.network``).
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, runtime_checkable

from triplane.engines.errors import EngineError

__all__ = ["MAX_FRAME", "FrameEngine", "Handler", "NetworkEngine", "NetworkEngineError", "Tap", "checksum",
           "send_now"]

MAX_FRAME = 16 << 20
"""The largest frame an engine carries by default (bytes)."""

Handler = Callable[[bytes], Awaitable[bytes | None]]
Tap = Callable[[bytes, Callable[[bytes], None]], None]


class NetworkEngineError(EngineError, ConnectionError):
    """A frame could not be delivered (no reply in time, peer unreachable, frame too big)."""

    kind = "unavailable"


@runtime_checkable
class NetworkEngine(Protocol):
    """Request/reply frames between nodes (see the module doc)."""

    name: str
    protocol: str
    max_frame: int

    async def serve(self, host: str, handler: Handler, port: int = 0) -> int: ...

    async def request(self, address: str, port: int, frame: bytes, *, timeout_s: float = 2.0) -> bytes: ...

    def set_wire(self, tap: Tap | None) -> None: ...

    async def close(self) -> None: ...


def send_now(data: bytes, send: Callable[[bytes], None]) -> None:
    """The default tap: put ``data`` on the wire at once."""
    send(data)


def checksum(data: bytes | memoryview) -> int:
    """CRC-32 of a frame (what both engines check a frame against)."""
    return zlib.crc32(data) & 0xFFFFFFFF


class FrameEngine:
    """What the built-in engines (udp, tcp) share: their name and ``max_frame``, the wire tap
    of ``set_wire``, request ids, and the handler tasks in flight (cancelled by ``close``)."""

    name: str
    max_frame: int

    def __init__(self, *, name: str, max_frame: int) -> None:
        self.name = name
        self.max_frame = max_frame
        self._tap: Tap = send_now
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    def set_wire(self, tap: Tap | None) -> None:
        self._tap = tap or send_now

    def _check_not_serving(self, server: object) -> None:
        if server is not None:
            raise RuntimeError(f"network engine {self.name!r} is already serving")

    def _check_frame(self, frame: bytes) -> None:
        if len(frame) > self.max_frame:
            raise NetworkEngineError(f"frame of {len(frame)} bytes exceeds {self.name}'s {self.max_frame}")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a handler's answer) as a task that ``close`` cancels."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()


REQUEST, REPLY = 1, 2
