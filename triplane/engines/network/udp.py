"""The udp network engine: frames cut into datagrams, reassembled, checked, resent.

Each datagram is a header ``!4sBQIIII`` (magic ``TPNU``, kind 1 request / 2 reply,
request id, chunk index, chunk count, frame length, CRC-32 of the whole frame) and at
most ``chunk`` bytes of the frame. The receiver keeps the chunks of a frame in any order
(duplicates ignored) until it has all of them and the checksum holds. The asker sends
every chunk again after 0.05, 0.1, 0.2 ... s until the reply is whole or ``timeout_s``
passed; a server that already answered that request sends its reply again (replies are
kept for a few seconds), so each round fills in what was lost. Partial frames are
bounded in number and age.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections import OrderedDict
from typing import Any

from triplane.engines.network.base import (
    MAX_FRAME,
    REPLY,
    REQUEST,
    FrameEngine,
    Handler,
    NetworkEngineError,
    checksum,
)

__all__ = ["UdpEngine"]

_HEAD = struct.Struct("!4sBQIIII")
_MAGIC = b"TPNU"
_CHUNK = 32 * 1024
_FIRST_RETRY_S = 0.05
_KEEP_S = 5.0          # how long a partial frame or an answered reply is kept
_MAX_PARTIAL = 256     # partial frames kept at once (per endpoint)
_MAX_KEPT_BYTES = 64 << 20  # bytes of partial frames, and of answered replies, kept at once
_BUFFER = 4 << 20      # socket buffers asked for


class _Partial:
    __slots__ = ("at", "chunks", "count", "crc", "held", "length")

    def __init__(self, count: int, length: int, crc: int) -> None:
        self.chunks: dict[int, bytes] = {}
        self.count, self.length, self.crc, self.at = count, length, crc, time.monotonic()
        self.held = 0

    def add(self, index: int, data: bytes) -> bytes | None:
        """The whole frame once every chunk is in and the checksum holds, else None."""
        if index not in self.chunks:
            self.chunks[index] = data
            self.held += len(data)
        if len(self.chunks) < self.count:
            return None
        frame = b"".join(self.chunks[i] for i in range(self.count))
        if len(frame) != self.length or checksum(frame) != self.crc:
            self.chunks.clear()  # a corrupt chunk: start again from the next round
            self.held = 0
            return None
        return frame


def _chunks(kind: int, rid: int, frame: bytes, size: int) -> list[bytes]:
    count = max(1, -(-len(frame) // size))
    crc = checksum(frame)
    return [_HEAD.pack(_MAGIC, kind, rid, i, count, len(frame), crc) + frame[i * size:(i + 1) * size]
            for i in range(count)]


class _Endpoint(asyncio.DatagramProtocol):
    """One UDP socket: the server's (answers requests) or the asker's (collects replies)."""

    def __init__(self, engine: UdpEngine, handler: Handler | None) -> None:
        self.engine = engine
        self.handler = handler
        self.transport: asyncio.DatagramTransport | None = None
        self.partial: OrderedDict[tuple[Any, int, int], _Partial] = OrderedDict()
        self.partial_bytes = 0
        self.answered: OrderedDict[tuple[Any, int], tuple[float, list[bytes], float]] = OrderedDict()
        self.answered_bytes = 0
        self.running: set[tuple[Any, int]] = set()
        self.waiting: dict[int, asyncio.Future[bytes]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, _BUFFER)

    def send(self, datagrams: list[bytes], addr: Any) -> None:
        for d in datagrams:
            def put(b: bytes) -> None:
                if self.transport is not None and not self.transport.is_closing():
                    self.transport.sendto(b, addr)
            self.engine._tap(d, put)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if len(data) < _HEAD.size:
            return
        magic, kind, rid, index, count, length, crc = _HEAD.unpack_from(data)
        if magic != _MAGIC or length > self.engine.max_frame or index >= count or count > length // 512 + 1:
            return
        if kind == REQUEST and self.handler is not None:
            self._request(addr, rid, index, count, length, crc, data[_HEAD.size:])
        elif kind == REPLY and rid in self.waiting:
            frame = self._assemble((addr, rid, kind), index, count, length, crc, data[_HEAD.size:])
            fut = self.waiting[rid]
            if frame is not None and not fut.done():
                fut.set_result(frame)

    def _assemble(self, key: tuple[Any, int, int], index: int, count: int, length: int, crc: int,
                  data: bytes) -> bytes | None:
        now = time.monotonic()
        while self.partial and (len(self.partial) >= _MAX_PARTIAL or self.partial_bytes > _MAX_KEPT_BYTES
                                or now - next(iter(self.partial.values())).at > _KEEP_S):
            self.partial_bytes -= self.partial.popitem(last=False)[1].held
        p = self.partial.get(key)
        if p is None or (p.count, p.length, p.crc) != (count, length, crc):
            if p is not None:
                self.partial_bytes -= p.held
            p = self.partial[key] = _Partial(count, length, crc)
        before = p.held
        frame = p.add(index, data)
        self.partial_bytes += p.held - before
        if frame is not None:
            self.partial_bytes -= p.held
            del self.partial[key]
        return frame

    def _request(self, addr: Any, rid: int, index: int, count: int, length: int, crc: int,
                 data: bytes) -> None:
        key = (addr, rid)
        now = time.monotonic()
        while self.answered and now - next(iter(self.answered.values()))[0] > _KEEP_S:
            self.answered_bytes -= sum(len(d) - _HEAD.size for d in self.answered.popitem(last=False)[1][1])
        done = self.answered.get(key)
        if done is not None:  # the asker lost (part of) our reply: send it again, once a round
            at, datagrams, last = done
            if now - last > _FIRST_RETRY_S / 2:
                self.answered[key] = (at, datagrams, now)
                self.send(datagrams, addr)
            return
        if key in self.running:
            return
        frame = self._assemble((addr, rid, REQUEST), index, count, length, crc, data)
        if frame is not None:
            self.running.add(key)
            self.engine._spawn(self._answer(addr, rid, frame))

    async def _answer(self, addr: Any, rid: int, frame: bytes) -> None:
        try:
            assert self.handler is not None
            reply = await self.handler(frame)
        finally:
            self.running.discard((addr, rid))
        if reply is None:
            return  # no answer: the asker's next round runs the handler again
        datagrams = _chunks(REPLY, rid, reply, self.engine.chunk)
        self.answered[(addr, rid)] = (time.monotonic(), datagrams, time.monotonic())
        self.answered_bytes += len(reply)
        while len(self.answered) > _MAX_PARTIAL or self.answered_bytes > _MAX_KEPT_BYTES:
            self.answered_bytes -= sum(len(d) - _HEAD.size for d in self.answered.popitem(last=False)[1][1])
        self.send(datagrams, addr)


class UdpEngine(FrameEngine):
    """Frames over UDP datagrams (see the module doc). ``UdpEngine(max_frame=16 MiB, chunk=32 KiB)``."""

    protocol = "udp"

    def __init__(self, *, max_frame: int = MAX_FRAME, chunk: int = _CHUNK, name: str = "udp") -> None:
        if not 512 <= chunk <= 60_000:
            raise ValueError(f"udp chunk must be 512..60000 bytes, got {chunk}")
        super().__init__(name=name, max_frame=max_frame)
        self.chunk = chunk
        self._server: _Endpoint | None = None
        self._client: _Endpoint | None = None

    async def serve(self, host: str, handler: Handler, port: int = 0) -> int:
        self._check_not_serving(self._server)
        loop = asyncio.get_running_loop()
        _, ep = await loop.create_datagram_endpoint(lambda: _Endpoint(self, handler), local_addr=(host, port))
        self._server = ep
        assert ep.transport is not None
        return int(ep.transport.get_extra_info("sockname")[1])

    async def request(self, address: str, port: int, frame: bytes, *, timeout_s: float = 2.0) -> bytes:
        self._check_frame(frame)
        loop = asyncio.get_running_loop()
        if self._client is None:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            _, self._client = await loop.create_datagram_endpoint(lambda: _Endpoint(self, None),
                                                                  family=family)
        ep = self._client
        rid = next(self._ids)
        fut: asyncio.Future[bytes] = loop.create_future()
        ep.waiting[rid] = fut
        datagrams = _chunks(REQUEST, rid, bytes(frame), self.chunk)
        deadline = loop.time() + timeout_s
        wait = _FIRST_RETRY_S
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    ep.send(datagrams, (address, port))
                except OSError as e:
                    raise NetworkEngineError(f"udp {address}:{port}: {e}") from None
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), min(wait, left))
                except TimeoutError:
                    wait = min(wait * 2, 0.5)
        finally:
            ep.waiting.pop(rid, None)
            for key in [k for k in ep.partial if k[1] == rid]:
                del ep.partial[key]
        raise NetworkEngineError(f"udp {address}:{port}: no whole reply within {timeout_s:g} s")

    async def close(self) -> None:
        self._cancel_tasks()
        for ep in (self._server, self._client):
            if ep is not None and ep.transport is not None:
                ep.transport.close()
        self._server = self._client = None
