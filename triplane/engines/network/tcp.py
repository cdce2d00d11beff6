"""The tcp network engine: frames on one TCP connection per peer, many requests in flight.

On the wire each frame is a header ``!4sBQII`` (magic ``TPNT``, kind 1 request / 2 reply,
request id, payload length, CRC-32 of the payload) and the payload. Replies are matched to
requests by id, so they may come back in any order. A frame whose checksum fails is
dropped (the asker retries); a bad magic or an oversize length closes the connection.
A request with no reply is sent again after 0.2, 0.4, 0.8 ... s until ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable

from triplane.engines.network.base import (
    MAX_FRAME,
    REPLY,
    REQUEST,
    FrameEngine,
    Handler,
    NetworkEngineError,
    checksum,
)

__all__ = ["TcpEngine"]

_HEAD = struct.Struct("!4sBQII")
_MAGIC = b"TPNT"
_FIRST_RETRY_S = 0.2


def _pack(kind: int, rid: int, payload: bytes) -> bytes:
    return _HEAD.pack(_MAGIC, kind, rid, len(payload), checksum(payload)) + payload


async def _read_frames(reader: asyncio.StreamReader, max_frame: int,
                       on_frame: Callable[[int, int, bytes], None]) -> None:
    """Read frames until EOF; ValueError on a bad header (the caller closes)."""
    while True:
        try:
            head = await reader.readexactly(_HEAD.size)
        except asyncio.IncompleteReadError:
            return
        magic, kind, rid, n, crc = _HEAD.unpack(head)
        if magic != _MAGIC or n > max_frame or kind not in (REQUEST, REPLY):
            raise ValueError(f"bad frame header (magic {magic!r}, kind {kind}, {n} bytes)")
        payload = await reader.readexactly(n)
        if checksum(payload) == crc:
            on_frame(kind, rid, payload)


def _retrieved(fut: asyncio.Future[bytes]) -> None:
    if not fut.cancelled():
        fut.exception()  # a connection that closed under a finished request: nobody waits


class _Conn:
    """One client connection: a reader task that hands replies to the waiting requests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame: int) -> None:
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[bytes]] = {}
        self.task = asyncio.get_running_loop().create_task(self._run(reader, max_frame))

    async def _run(self, reader: asyncio.StreamReader, max_frame: int) -> None:
        with contextlib.suppress(Exception):
            await _read_frames(reader, max_frame, self._on_frame)
        self.writer.close()
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(NetworkEngineError("connection closed"))

    def _on_frame(self, kind: int, rid: int, payload: bytes) -> None:
        fut = self.waiting.get(rid)
        if kind == REPLY and fut is not None and not fut.done():
            fut.set_result(payload)

    @property
    def alive(self) -> bool:
        return not self.task.done() and not self.writer.is_closing()


class TcpEngine(FrameEngine):
    """Frames over TCP (see the module doc). ``TcpEngine(max_frame=16 MiB)``."""

    protocol = "tcp"

    def __init__(self, *, max_frame: int = MAX_FRAME, name: str = "tcp") -> None:
        super().__init__(name=name, max_frame=max_frame)
        self._server: asyncio.Server | None = None
        self._served: set[asyncio.StreamWriter] = set()
        self._conns: dict[tuple[str, int], _Conn] = {}
        self._opening: dict[tuple[str, int], asyncio.Lock] = {}

    # --- serving -------------------------------------------------------------------------

    async def serve(self, host: str, handler: Handler, port: int = 0) -> int:
        self._check_not_serving(self._server)

        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._served.add(writer)

            def on_frame(kind: int, rid: int, payload: bytes) -> None:
                if kind == REQUEST:
                    self._spawn(self._answer(handler, writer, rid, payload))
            try:
                await _read_frames(reader, self.max_frame, on_frame)
            except (ValueError, ConnectionError, asyncio.CancelledError):
                pass  # a bad frame, a reset or our close: the connection ends
            finally:
                self._served.discard(writer)
                writer.close()

        self._server = await asyncio.start_server(client, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _answer(self, handler: Handler, writer: asyncio.StreamWriter, rid: int, payload: bytes) -> None:
        reply = await handler(payload)
        if reply is not None and not writer.is_closing():
            self._write(writer, _pack(REPLY, rid, reply))

    def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        def send(b: bytes) -> None:
            if not writer.is_closing():
                writer.write(b)
        self._tap(data, send)

    # --- asking --------------------------------------------------------------------------

    async def _conn(self, address: str, port: int) -> _Conn:
        key = (address, port)
        conn = self._conns.get(key)
        if conn is not None and conn.alive:
            return conn
        async with self._opening.setdefault(key, asyncio.Lock()):  # one connection per peer
            conn = self._conns.get(key)
            if conn is None or not conn.alive:
                try:
                    reader, writer = await asyncio.open_connection(address, port)
                except OSError as e:
                    raise NetworkEngineError(f"tcp {address}:{port}: {e}") from None
                conn = self._conns[key] = _Conn(reader, writer, self.max_frame)
            return conn

    async def request(self, address: str, port: int, frame: bytes, *, timeout_s: float = 2.0) -> bytes:
        self._check_frame(frame)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        rid = next(self._ids)
        data = _pack(REQUEST, rid, bytes(frame))
        wait = _FIRST_RETRY_S
        last = "no reply"
        while (left := deadline - loop.time()) > 0:
            try:
                conn = await asyncio.wait_for(self._conn(address, port), left)
            except (NetworkEngineError, TimeoutError) as e:
                last = str(e) or "connect timed out"
                await asyncio.sleep(min(wait, max(deadline - loop.time(), 0)))
                wait *= 2
                continue
            fut = conn.waiting.get(rid) or conn.waiting.setdefault(rid, loop.create_future())
            fut.add_done_callback(_retrieved)
            self._write(conn.writer, data)
            try:
                return await asyncio.wait_for(asyncio.shield(fut), min(wait, left))
            except TimeoutError:
                wait *= 2
            except NetworkEngineError as e:
                last = str(e)
                conn.waiting.pop(rid, None)
            finally:
                if fut.done():
                    conn.waiting.pop(rid, None)
        for conn in self._conns.values():
            conn.waiting.pop(rid, None)
        raise NetworkEngineError(f"tcp {address}:{port}: {last} within {timeout_s:g} s")

    async def close(self) -> None:
        self._cancel_tasks()
        for conn in self._conns.values():
            conn.writer.close()
            conn.task.cancel()
        self._conns.clear()
        for writer in list(self._served):
            writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
