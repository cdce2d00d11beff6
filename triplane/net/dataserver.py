"""The data port's server (``triplane.net.dataport``; the wire format: ``proto/dataport.md``).

``DataServer`` serves a ``TileSource`` -- the executor's memory engine
(``triplane.executor.dataport.EngineTiles``) or the scheduler's uploads
(``triplane.scheduler.store.UploadTiles``, read-only) -- to holders of the cluster secret.
It checks every request's tag before parsing it, accepts each nonce once, answers with
responses bound to the request's nonce and sends data in tagged chunks. A request it
cannot authenticate gets a refusal and the connection is closed, as does a stale or
replayed one; ``missing`` and ``full`` answers keep the connection (a ``put`` that does
not fit is drained first). It never dies from one connection and holds every connection
to the port's ``Limits`` (``triplane.net.guard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any, Protocol

import numpy as np

from triplane.net.guard import DEFAULT_LIMITS, ConnectionGuard, Limits
from triplane.net.sockio import Closed, np_dtype, recv, recv_chunks, recv_into, send_chunks
from triplane.proto.dataport import (
    CHUNK_BYTES,
    CHUNK_TAG_BYTES,
    LENGTH,
    MAX_REQUEST_HEADER,
    TAG_BYTES,
    ChunkMac,
    DataPortError,
    NonceGuard,
    Request,
    encode_response,
    parse_request,
    refusal,
    verify_request,
)

__all__ = ["DataServer", "TileSource"]

log = logging.getLogger(__name__)


class TileSource(Protocol):
    """What a ``DataServer`` serves. ``read`` may block (``blocking_reads``: the server
    then calls it in a worker thread, unless the source's optional ``cheap(tile)`` says
    this read does not block, e.g. bytes held in memory). A read-only source refuses ``put`` and ``delete``
    (``writable`` false) and need not implement the other methods."""

    writable: bool
    blocking_reads: bool

    def read(self, tile: str) -> tuple[tuple[int, ...], str, memoryview] | None:
        """(shape, dtype name, C-order little-endian bytes) of ``tile``; None if not held."""

    def reserve(self, nbytes: int, tile: str) -> None:
        """Hold ``nbytes`` for a put of ``tile``; ``DataPortError(kind="full")`` if no room."""

    def release(self, nbytes: int) -> None:
        """Give back a reservation whose put did not complete."""

    def store(self, tile: str, array: np.ndarray, reserved: int) -> None:
        """Keep ``array`` as ``tile`` (using the reservation); ``DataPortError`` if not."""

    def delete(self, tile: str) -> None:
        """Drop ``tile``; an absent one is fine."""


class DataServer:
    """Serves ``source`` on ``host:port`` (0: ephemeral; :attr:`port` after :meth:`start`).

    ``limits`` bound connections, idle time and unauthenticated bytes in flight;
    ``io_timeout`` bounds one authenticated request's transfer."""

    def __init__(self, source: TileSource, secret: bytes, *, host: str = "127.0.0.1", port: int = 0,
                 limits: Limits = DEFAULT_LIMITS, io_timeout: float = 120.0) -> None:
        self.source = source
        self.secret = secret
        self.host = host
        self.port = port
        self.io_timeout = io_timeout
        self.guard = ConnectionGuard(limits)
        self.nonces = NonceGuard()
        self.stats = {"requests": 0, "refused": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0}
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Listen (on ``host``/``port`` if given, else those of the constructor); the port."""
        self.host = self.host if host is None else host
        self.port = self.port if port is None else port
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        self._accept_task = loop.create_task(self._accept_loop(), name="dataport-accept")
        return self.port

    async def close(self) -> None:
        """Stop accepting and drop every connection."""
        if self._accept_task is not None:
            self._accept_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept_task
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def all_stats(self) -> dict[str, Any]:
        return {**self.stats, "connections": self.guard.stats(), "nonces": len(self.nonces)}

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as e:  # e.g. EMFILE: back off instead of spinning
                log.warning("data port: accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            if not self.guard.admit():
                conn.close()
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        idle_s = self.guard.limits.idle_timeout
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(self._recv_request(loop, conn), idle_s)
                except asyncio.TimeoutError:
                    self.guard.idle()
                    return
                except (Closed, OSError):
                    return
                if frame is None:
                    return  # out of sync or over budget: nothing to answer
                tag, header = frame
                self.stats["requests"] += 1
                if not verify_request(tag, header, self.secret):
                    self.stats["refused"] += 1
                    await loop.sock_sendall(conn, refusal("unauthorized: the request's tag does not match "
                                                          "(wrong cluster secret?)"))
                    return
                try:
                    req = parse_request(header)
                except DataPortError as e:  # authenticated but unreadable: a peer's bug
                    self.stats["refused"] += 1
                    await loop.sock_sendall(conn, refusal(str(e), kind=e.kind))
                    return
                try:
                    self.nonces.check(req.nonce, req.t, time.time())
                except DataPortError as e:
                    self.stats["refused"] += 1
                    await loop.sock_sendall(conn, self._error(req, e.kind, str(e)))
                    return  # a put's data may follow: do not read it as a header
                try:
                    keep = await asyncio.wait_for(self._handle(loop, conn, req), self.io_timeout)
                except (asyncio.TimeoutError, Closed, OSError):
                    return
                if not keep:
                    return
        except Exception:  # never let one connection take the server down
            self.stats["errors"] += 1
            log.exception("data port: connection failed")
        finally:
            self.guard.leave()
            conn.close()

    async def _recv_request(self, loop: asyncio.AbstractEventLoop,
                            conn: socket.socket) -> tuple[bytes, bytes] | None:
        """(tag, header) of the next request, or None if its length is out of bounds or the
        port's budget of unauthenticated bytes is spent."""
        head = bytearray(LENGTH.size)
        await recv_into(loop, conn, memoryview(head), first=True)
        (n,) = LENGTH.unpack(head)
        if not 0 < n <= MAX_REQUEST_HEADER:
            self.stats["refused"] += 1
            return None
        if not self.guard.take(n + TAG_BYTES):
            return None
        try:
            body = await recv(loop, conn, TAG_BYTES + n)
        finally:
            self.guard.give(n + TAG_BYTES)
        return body[:TAG_BYTES], body[TAG_BYTES:]

    def _error(self, req: Request, kind: str, message: str) -> bytes:
        return encode_response(self.secret, req.nonce, False, kind=kind, message=message)

    async def _handle(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, req: Request) -> bool:
        """Answer one authenticated request; false if the connection must be closed after."""
        src = self.source
        if req.op in ("put", "delete") and not src.writable:
            self.stats["refused"] += 1
            msg = f"this data port is read-only ({req.op})"
            await loop.sock_sendall(conn, self._error(req, "refused", msg))
            return req.op != "put"  # a put's data would follow: do not read it as a header
        if req.op == "delete":
            for tile in req.tiles:
                src.delete(tile)
            await loop.sock_sendall(conn, encode_response(self.secret, req.nonce, True))
            return True
        if req.op == "put":
            return await self._put(loop, conn, req)
        assert req.tile is not None
        blocking = src.blocking_reads and not (hasattr(src, "cheap") and src.cheap(req.tile))
        found = await asyncio.to_thread(src.read, req.tile) if blocking else src.read(req.tile)
        if found is None:
            await loop.sock_sendall(conn, self._error(req, "missing", f"no such tile: {req.tile}"))
            return True
        shape, dtype, view = found
        await loop.sock_sendall(conn, encode_response(self.secret, req.nonce, True, shape=shape, dtype=dtype,
                                                      nbytes=len(view)))
        if req.op == "get" and len(view):
            await send_chunks(loop, conn, view, ChunkMac(self.secret, "get", req.nonce))
            self.stats["bytes_out"] += len(view)
        return True

    async def _put(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, req: Request) -> bool:
        assert req.tile is not None and req.shape is not None and req.dtype is not None
        mac = ChunkMac(self.secret, "put", req.nonce)
        try:
            self.source.reserve(req.bytes, req.tile)
        except DataPortError as e:
            await self._drain(loop, conn, req.bytes)
            await loop.sock_sendall(conn, self._error(req, e.kind, str(e)))
            return True
        try:
            arr = np.empty(req.shape, dtype=np_dtype(req.dtype))
            ok = await recv_chunks(loop, conn, memoryview(arr.reshape(-1).view(np.uint8)), mac)
        except BaseException:
            self.source.release(req.bytes)
            raise
        if not ok:
            self.source.release(req.bytes)
            self.stats["refused"] += 1
            await loop.sock_sendall(conn, self._error(req, "unauthorized", "a chunk's tag does not match"))
            return False
        self.stats["bytes_in"] += req.bytes
        try:
            self.source.store(req.tile, arr, req.bytes)
        except DataPortError as e:
            await loop.sock_sendall(conn, self._error(req, e.kind, str(e)))
            return True
        await loop.sock_sendall(conn, encode_response(self.secret, req.nonce, True, shape=req.shape,
                                                      dtype=req.dtype, nbytes=req.bytes))
        return True

    async def _drain(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, n: int) -> None:
        """Read and discard the tagged chunks of ``n`` data bytes."""
        n += CHUNK_TAG_BYTES * -(-n // CHUNK_BYTES)
        buf = memoryview(bytearray(min(n, CHUNK_BYTES) or 1))
        while n > 0:
            k = await loop.sock_recv_into(conn, buf[:min(n, len(buf))])
            if k == 0:
                raise Closed(False)
            n -= k
