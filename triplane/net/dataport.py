"""The data port: tiles between nodes over TCP (the wire format: ``proto/dataport.md``).

One server and one client for every node. ``DataServer`` serves a ``TileSource`` -- the
executor's memory engine (``triplane.executor.dataport.EngineTiles``) or the scheduler's
uploads (``triplane.scheduler.store.UploadTiles``, read-only). ``DataClient`` is what
executors pull inputs with and what the scheduler streams results and releases tiles with.

Trust. Every request and every response is authenticated with the cluster secret, and
tags are checked before anything is parsed; a response is bound to its request's nonce;
data travels in tagged chunks and is handed out only once its chunk's tag matched. So a
peer without the secret -- a poisoned registry address, a stranger on the network -- can
make a request fail (``DataPortError`` of kind ``unauthenticated``), never give it data.

Failure semantics. The server answers every request it can read; a request it cannot
authenticate gets a refusal (``proto.dataport.refusal``) and the connection is closed, as
does a stale or replayed one. ``missing`` and ``full`` answers keep the connection (a
``put`` that does not fit is drained first). The server never dies from one connection,
and holds every connection to the port's ``Limits`` (``triplane.net.guard``). The client
raises ``DataPortError`` for everything (``kind`` says what); a pooled connection found
dead before any answer is retried once on a fresh one (with a fresh nonce).

Tiles stream without extra copies: the server sends the stored array's buffer
(``sock_sendall`` of a memoryview) and the client receives into a preallocated
``np.empty`` (``sock_recv_into``). Raw bytes are C order, little-endian.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol, TypeVar

import numpy as np

from triplane.net.guard import DEFAULT_LIMITS, ConnectionGuard, Limits
from triplane.proto import dtypes as dt
from triplane.proto.dataport import (
    CHUNK_BYTES,
    LENGTH,
    MAX_DELETE_TILES,
    MAX_REQUEST_HEADER,
    MAX_RESPONSE_HEADER,
    TAG_BYTES,
    ChunkMac,
    DataPortError,
    NonceGuard,
    Request,
    Response,
    encode_request,
    encode_response,
    parse_request,
    parse_response,
    refusal,
    unverified_error,
    verify_request,
    verify_response,
)

__all__ = ["DataClient", "DataPortError", "DataServer", "Response", "TileSource", "byte_view"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class TileSource(Protocol):
    """What a ``DataServer`` serves. ``read`` may block (``blocking_reads``: the server
    then calls it in a worker thread). A read-only source refuses ``put`` and ``delete``
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


class _Closed(ConnectionError):
    """The peer closed the connection (cleanly if ``at_boundary``: between two frames)."""

    def __init__(self, at_boundary: bool) -> None:
        self.at_boundary = at_boundary
        super().__init__("connection closed by peer")


async def _recv_into(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview,
                     first: bool = False) -> None:
    pos, n = 0, len(view)
    while pos < n:
        k = await loop.sock_recv_into(sock, view[pos:])
        if k == 0:
            raise _Closed(first and pos == 0)
        pos += k


async def _recv(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    await _recv_into(loop, sock, memoryview(buf))
    return bytes(buf)


def byte_view(arr: np.ndarray) -> memoryview:
    """The array's bytes, C order little-endian, without copying when it already is."""
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return memoryview(arr.reshape(-1).view(np.uint8))


async def _send_chunks(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview,
                       mac: ChunkMac) -> None:
    for i, pos in enumerate(range(0, len(view), CHUNK_BYTES)):
        chunk = view[pos:pos + CHUNK_BYTES]
        await loop.sock_sendall(sock, chunk)
        await loop.sock_sendall(sock, mac.tag(i, chunk))


async def _recv_chunks(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview,
                       mac: ChunkMac) -> bool:
    """Receive tagged chunks into ``view``; False at the first chunk whose tag is wrong."""
    tag = bytearray(TAG_BYTES)
    for i, pos in enumerate(range(0, len(view), CHUNK_BYTES)):
        chunk = view[pos:pos + CHUNK_BYTES]
        await _recv_into(loop, sock, chunk)
        await _recv_into(loop, sock, memoryview(tag))
        if not mac.check(i, chunk, tag):
            return False
    return True


async def _within(aw: Awaitable[T], timeout: float, what: str) -> T:
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise DataPortError(f"{what}: timed out after {timeout:g} s", kind="unavailable") from None


def _np_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(dt.BY_NAME[name].np)


# --- server --------------------------------------------------------------------------


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
                except (_Closed, OSError):
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
                except (asyncio.TimeoutError, _Closed, OSError):
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
        await _recv_into(loop, conn, memoryview(head), first=True)
        (n,) = LENGTH.unpack(head)
        if not 0 < n <= MAX_REQUEST_HEADER:
            self.stats["refused"] += 1
            return None
        if not self.guard.take(n + TAG_BYTES):
            return None
        try:
            body = await _recv(loop, conn, TAG_BYTES + n)
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
        found = await asyncio.to_thread(src.read, req.tile) if src.blocking_reads else src.read(req.tile)
        if found is None:
            await loop.sock_sendall(conn, self._error(req, "missing", f"no such tile: {req.tile}"))
            return True
        shape, dtype, view = found
        await loop.sock_sendall(conn, encode_response(self.secret, req.nonce, True, shape=shape, dtype=dtype,
                                                      nbytes=len(view)))
        if req.op == "get" and len(view):
            await _send_chunks(loop, conn, view, ChunkMac(self.secret, "get", req.nonce))
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
            arr = np.empty(req.shape, dtype=_np_dtype(req.dtype))
            ok = await _recv_chunks(loop, conn, memoryview(arr.reshape(-1).view(np.uint8)), mac)
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
        n += TAG_BYTES * -(-n // CHUNK_BYTES)
        buf = memoryview(bytearray(min(n, CHUNK_BYTES) or 1))
        while n > 0:
            k = await loop.sock_recv_into(conn, buf[:min(n, len(buf))])
            if k == 0:
                raise _Closed(False)
            n -= k


# --- client --------------------------------------------------------------------------


class DataClient:
    """Client of data ports, with a pool of idle connections per peer.

    Every method raises ``DataPortError`` on failure (see the module docstring). Create it
    in (and use it from) one event loop; :meth:`close` drops the pooled connections.
    """

    def __init__(self, secret: bytes, *, connect_timeout: float = 5.0, io_timeout: float = 120.0,
                 max_idle_per_peer: int = 8) -> None:
        self.secret = secret
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout
        self.max_idle_per_peer = max_idle_per_peer
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}

    async def get(self, addr: str, port: int, tile: str) -> np.ndarray:
        """The tile's array (a fresh, writable array owned by the caller)."""
        return await self._call(addr, port, "get", f"get {tile}", tile=tile)

    async def put(self, addr: str, port: int, tile: str, array: np.ndarray) -> None:
        """Store ``array`` as ``tile`` on the peer (replacing a tile of that id)."""
        array = np.asarray(array)
        await self._call(addr, port, "put", f"put {tile}", tile=tile, body=byte_view(array),
                         shape=tuple(array.shape), dtype=dt.dtype(array.dtype).name)

    async def delete(self, addr: str, port: int, tiles: list[str] | tuple[str, ...]) -> None:
        """Delete tiles on the peer (any number; sent in requests of ``MAX_DELETE_TILES``);
        absent ones are not an error."""
        for i in range(0, len(tiles), MAX_DELETE_TILES):
            part = tuple(tiles[i:i + MAX_DELETE_TILES])
            await self._call(addr, port, "delete", f"delete {len(part)} tile(s)", tiles=part)

    async def stat(self, addr: str, port: int, tile: str) -> Response:
        """``Response`` with the tile's shape, dtype and bytes (no data)."""
        return await self._call(addr, port, "stat", f"stat {tile}", tile=tile)

    async def open_tile(self, addr: str, port: int,
                        tile: str) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
        """(shape, dtype, bytes, chunks) of ``tile``, streamed: each chunk is yielded once its
        tag matched (a forged one raises ``DataPortError`` instead). Iterate ``chunks`` to the
        end, or close it, to give the connection back."""
        loop = asyncio.get_running_loop()
        what = f"get {tile} at {addr}:{port}"
        sock, resp, nonce = await self._open(addr, port, "get", what, tile=tile)
        assert resp.shape is not None and resp.dtype is not None

        async def chunks() -> AsyncIterator[bytes]:
            mac = ChunkMac(self.secret, "get", nonce)
            done = False
            try:
                tag = bytearray(TAG_BYTES)
                for i, pos in enumerate(range(0, resp.bytes, CHUNK_BYTES)):
                    buf = bytearray(min(CHUNK_BYTES, resp.bytes - pos))
                    try:
                        await _within(_recv_into(loop, sock, memoryview(buf)), self.io_timeout, what)
                        await _within(_recv_into(loop, sock, memoryview(tag)), self.io_timeout, what)
                    except DataPortError:
                        raise
                    except (_Closed, OSError) as e:
                        raise DataPortError(f"{what}: connection lost mid-tile ({e})",
                                            kind="unavailable") from None
                    if not mac.check(i, buf, tag):
                        raise _forged(what)
                    yield bytes(buf)
                done = True
            finally:
                self._give_back((addr, port), sock, done)

        return resp.shape, resp.dtype, resp.bytes, chunks()

    async def close(self) -> None:
        for socks in self._idle.values():
            for s in socks:
                s.close()
        self._idle.clear()

    async def __aenter__(self) -> DataClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- internals -------------------------------------------------------------------

    async def _connect(self, addr: str, port: int) -> socket.socket:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await _within(loop.sock_connect(sock, (addr, port)), self.connect_timeout,
                          f"connecting to data port {addr}:{port}")
        except OSError as e:
            sock.close()
            raise DataPortError(f"cannot connect to data port {addr}:{port}: {e.strerror or e}",
                                kind="unavailable") from None
        except BaseException:
            sock.close()
            raise
        return sock

    def _give_back(self, peer: tuple[str, int], sock: socket.socket, keep: bool) -> None:
        idle = self._idle.setdefault(peer, [])
        if keep and len(idle) < self.max_idle_per_peer:
            idle.append(sock)
        else:
            sock.close()

    async def _open(self, addr: str, port: int, op: Any, what: str, *, tile: str | None = None,
                    tiles: tuple[str, ...] = (), body: memoryview | None = None,
                    shape: tuple[int, ...] | None = None,
                    dtype: str | None = None) -> tuple[socket.socket, Response, bytes]:
        """Send one request and read its (authenticated, ok) response header: (the socket, the
        response, the nonce). An error answer raises (the connection kept when it can be)."""
        peer = (addr, port)
        for attempt in (0, 1):
            idle = self._idle.get(peer)
            reused = bool(idle)
            sock = idle.pop() if idle else await self._connect(addr, port)
            frame, nonce = encode_request(op, self.secret, now=time.time(), tile=tile, tiles=tiles,
                                          shape=shape, dtype=dtype, nbytes=0 if body is None else len(body))
            try:
                resp = await _within(self._exchange(sock, frame, nonce, body, what), self.io_timeout, what)
            except DataPortError:  # a ConnectionError too: before the OSError clause
                sock.close()
                raise
            except _Closed as e:
                sock.close()
                if reused and attempt == 0 and e.at_boundary:
                    continue  # the pooled connection had died while idle
                raise DataPortError(f"{what}: connection closed by the peer", kind="unavailable") from None
            except OSError as e:
                sock.close()
                if reused and attempt == 0:
                    continue
                raise DataPortError(f"{what}: {e.strerror or e}", kind="unavailable") from None
            except BaseException:
                sock.close()
                raise
            if not resp.ok:
                # The server keeps the connection after these answers only; the rest close it.
                self._give_back(peer, sock, resp.kind in ("missing", "full") or
                                (resp.kind == "refused" and op != "put"))
                raise DataPortError(f"{what}: {resp.message}", kind=resp.kind or "protocol")
            return sock, resp, nonce
        raise AssertionError("unreachable")

    async def _call(self, addr: str, port: int, op: Any, what: str, **kw: Any) -> Any:
        what = f"{what} at {addr}:{port}"
        sock, resp, nonce = await self._open(addr, port, op, what, **kw)
        if op != "get":
            self._give_back((addr, port), sock, True)
            return None if op in ("put", "delete") else resp
        assert resp.shape is not None and resp.dtype is not None
        arr = np.empty(resp.shape, dtype=_np_dtype(resp.dtype))
        ok = False
        try:
            loop = asyncio.get_running_loop()
            mac = ChunkMac(self.secret, "get", nonce)
            ok = await _within(_recv_chunks(loop, sock, memoryview(arr.reshape(-1).view(np.uint8)), mac),
                               self.io_timeout, what)
        except DataPortError:
            raise
        except (_Closed, OSError) as e:
            raise DataPortError(f"{what}: connection lost mid-tile ({e})", kind="unavailable") from None
        finally:
            self._give_back((addr, port), sock, ok)
        if not ok:
            raise _forged(what)
        return arr

    async def _exchange(self, sock: socket.socket, frame: bytes, nonce: bytes, body: memoryview | None,
                        what: str) -> Response:
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(sock, frame)
            if body is not None and len(body):
                await _send_chunks(loop, sock, body, ChunkMac(self.secret, "put", nonce))
        except OSError:
            # The server may have refused the header and closed: its answer says why.
            try:
                return await asyncio.wait_for(self._response(loop, sock, nonce, what), 1.0)
            except DataPortError:
                raise
            except (asyncio.TimeoutError, OSError, _Closed):
                raise _Closed(True) from None
        return await self._response(loop, sock, nonce, what)

    async def _response(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, nonce: bytes,
                        what: str) -> Response:
        head = bytearray(LENGTH.size)
        await _recv_into(loop, sock, memoryview(head), first=True)
        (n,) = LENGTH.unpack(head)
        if not 0 < n <= MAX_RESPONSE_HEADER:
            raise DataPortError(f"{what}: the peer broke the protocol (response header of {n} bytes): "
                                "not a triplane data port?", kind="protocol")
        body = await _recv(loop, sock, TAG_BYTES + n)
        tag, header = body[:TAG_BYTES], body[TAG_BYTES:]
        if not verify_response(tag, header, nonce, self.secret):
            said = unverified_error(tag, header)
            hint = f"; it says: {said!r}" if said else ""
            raise DataPortError(f"{what}: the response is not authenticated -- the peer does not hold "
                                f"this cluster's secret (misconfigured node, or an impostor at that "
                                f"address){hint}", kind="unauthenticated")
        return parse_response(header)


def _forged(what: str) -> DataPortError:
    return DataPortError(f"{what}: a data chunk's tag does not match -- corrupted or forged data "
                         "(an impostor at that address?)", kind="unauthenticated")
