"""The data port: tiles between nodes over TCP, peer to peer (docs/runtime.md, "The data port").

``DataServer`` serves ``get``/``put``/``delete``/``stat`` of the tiles in a memory engine
(the executor's host engine; the scheduler serves uploaded tensors the same way).
``DataClient`` is what the scheduler, the SDK side and executors use to reach one.

Tiles stream without extra copies: a ``get`` sends the stored array's own buffer
(``sock_sendall`` of a memoryview) and the client receives into a preallocated
``np.empty`` (``sock_recv_into``); a ``put`` does the same the other way round, after
reserving the bytes in the memory engine so that concurrent uploads cannot overshoot its
capacity. Raw bytes are C order, little-endian (the host order of every platform we run on).

Failure semantics. The server answers every request it can read with a response header;
a request it refuses (unsigned, bad signature, stale, malformed) gets ``ok: false`` and the
connection is closed, since the bytes that may follow cannot be trusted. A ``put`` that is
signed but does not fit is drained and answered ``memory full: ...``; the connection stays
usable. The client raises ``DataPortError`` for a refusal, an ``ok: false`` answer (``missing``
set for "no such tile"), a timeout or a broken connection; a pooled connection that turns
out dead before any answer is retried once on a fresh one (every request is idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np

from triplane.engines.errors import MemoryFullError, MissingTileError
from triplane.executor.datawire import (
    HEADER,
    MAX_HEADER_BYTES,
    DataPortError,
    Request,
    Response,
    make_request,
    make_response,
    parse_request,
    parse_response,
)
from triplane.proto import dtypes as dt

__all__ = ["DataClient", "DataPortError", "DataServer", "Response"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_DRAIN_CHUNK = 1 << 20


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


async def _recv_frame(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    head = bytearray(4)
    await _recv_into(loop, sock, memoryview(head), first=True)
    (n,) = HEADER.unpack(head)
    if not 0 < n <= MAX_HEADER_BYTES:
        raise DataPortError(f"bad header frame length {n} (bound 1..{MAX_HEADER_BYTES})")
    body = bytearray(n)
    await _recv_into(loop, sock, memoryview(body))
    return bytes(body)


def _byte_view(arr: np.ndarray) -> memoryview:
    """The array's bytes, C order little-endian, without copying when it already is."""
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return memoryview(arr.reshape(-1).view(np.uint8))


def _np_dtype(name: str) -> np.dtype:
    return dt.BY_NAME[name].np


async def _within(aw: Awaitable[T], timeout: float, what: str) -> T:
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise DataPortError(f"{what}: timed out after {timeout:g} s") from None


# --- server --------------------------------------------------------------------------


class DataServer:
    """Serves the tiles of ``store`` (a memory engine with ``reserve``/``release``) on
    ``host:port`` (0: ephemeral; see :attr:`port` after :meth:`start`)."""

    def __init__(self, store: Any, secret: bytes, *, host: str = "127.0.0.1", port: int = 0,
                 idle_timeout: float = 300.0, io_timeout: float = 120.0) -> None:
        self.store = store
        self.secret = secret
        self.host = host
        self.port = port
        self.idle_timeout = idle_timeout
        self.io_timeout = io_timeout
        self.stats = {"requests": 0, "refused": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0}
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
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
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    payload = await asyncio.wait_for(_recv_frame(loop, conn), self.idle_timeout)
                except (asyncio.TimeoutError, _Closed, DataPortError, OSError):
                    return  # idle, gone, or out of sync: nothing to answer
                self.stats["requests"] += 1
                try:
                    req = parse_request(payload, self.secret)
                except DataPortError as e:
                    self.stats["refused"] += 1
                    await loop.sock_sendall(conn, make_response(False, str(e)))
                    return
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
            conn.close()

    async def _handle(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, req: Request) -> bool:
        """Answer one request; false if the connection must be closed afterwards."""
        if req.op == "delete":
            for tile in req.tiles:
                self.store.delete(tile)
            await loop.sock_sendall(conn, make_response(True))
            return True
        if req.op == "put":
            return await self._put(loop, conn, req)
        try:
            arr = self.store.get(req.tile)
        except MissingTileError as e:
            await loop.sock_sendall(conn, make_response(False, str(e)))
            return True
        view = _byte_view(arr)
        header = make_response(True, shape=tuple(arr.shape), dtype=dt.dtype(arr.dtype).name,
                               nbytes=len(view))
        if req.op == "stat":
            await loop.sock_sendall(conn, header)
            return True
        await loop.sock_sendall(conn, header)
        if len(view):
            await loop.sock_sendall(conn, view)
        self.stats["bytes_out"] += len(view)
        return True

    async def _put(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, req: Request) -> bool:
        assert req.tile is not None and req.shape is not None and req.dtype is not None
        try:
            self.store.reserve(req.bytes, req.tile)
        except MemoryFullError as e:
            await self._drain(loop, conn, req.bytes)
            await loop.sock_sendall(conn, make_response(False, str(e)))
            return True
        try:
            arr = np.empty(req.shape, dtype=_np_dtype(req.dtype))
            if req.bytes:
                await _recv_into(loop, conn, memoryview(arr.reshape(-1).view(np.uint8)))
        except BaseException:
            self.store.release(req.bytes)
            raise
        self.stats["bytes_in"] += req.bytes
        try:
            self.store.put(req.tile, arr, reserved=req.bytes)
        except MemoryFullError as e:
            await loop.sock_sendall(conn, make_response(False, str(e)))
            return True
        await loop.sock_sendall(conn, make_response(True, shape=req.shape, dtype=req.dtype, nbytes=req.bytes))
        return True

    async def _drain(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, n: int) -> None:
        buf = memoryview(bytearray(min(n, _DRAIN_CHUNK)))
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
        frame = make_request("get", self.secret, tile=tile)
        return await self._call(addr, port, frame, None, receive=True, what=f"get {tile}")

    async def put(self, addr: str, port: int, tile: str, array: np.ndarray) -> None:
        """Store ``array`` as ``tile`` on the peer (replacing a tile of that id)."""
        array = np.asarray(array)
        frame = make_request("put", self.secret, tile=tile, array=array)
        await self._call(addr, port, frame, _byte_view(array), receive=False, what=f"put {tile}")

    async def delete(self, addr: str, port: int, tiles: list[str] | tuple[str, ...]) -> None:
        """Delete tiles on the peer; absent ones are not an error."""
        frame = make_request("delete", self.secret, tiles=tuple(tiles))
        await self._call(addr, port, frame, None, receive=False, what=f"delete {len(tiles)} tile(s)")

    async def stat(self, addr: str, port: int, tile: str) -> Response:
        """``Response`` with the tile's shape, dtype and bytes (no data)."""
        frame = make_request("stat", self.secret, tile=tile)
        return await self._call(addr, port, frame, None, receive=False, what=f"stat {tile}")

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
            raise DataPortError(f"cannot connect to data port {addr}:{port}: {e.strerror or e}") from None
        except BaseException:
            sock.close()
            raise
        return sock

    async def _call(self, addr: str, port: int, frame: bytes, body: memoryview | None, *,
                    receive: bool, what: str) -> Any:
        peer = (addr, port)
        for attempt in (0, 1):
            idle = self._idle.get(peer)
            reused = bool(idle)
            sock = idle.pop() if idle else await self._connect(addr, port)
            try:
                result, keep = await _within(self._exchange(sock, frame, body, receive),
                                             self.io_timeout, f"{what} at {addr}:{port}")
            except _Closed as e:
                sock.close()
                if reused and attempt == 0 and e.at_boundary:
                    continue  # the pooled connection had died while idle
                raise DataPortError(f"{what} at {addr}:{port}: connection closed by the peer") from None
            except OSError as e:
                sock.close()
                if reused and attempt == 0:
                    continue
                raise DataPortError(f"{what} at {addr}:{port}: {e.strerror or e}") from None
            except BaseException:
                sock.close()
                raise
            if keep and len(self._idle.setdefault(peer, [])) < self.max_idle_per_peer:
                self._idle[peer].append(sock)
            else:
                sock.close()
            if isinstance(result, DataPortError):
                raise result
            return result
        raise AssertionError("unreachable")

    async def _exchange(self, sock: socket.socket, frame: bytes, body: memoryview | None,
                        receive: bool) -> tuple[Any, bool]:
        """One request/response; returns (result or DataPortError, keep the connection)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(sock, frame)
            if body is not None and len(body):
                await loop.sock_sendall(sock, body)
        except OSError:
            # The server may have refused the header and closed: its answer says why.
            try:
                resp = parse_response(await asyncio.wait_for(_recv_frame(loop, sock), 1.0))
            except Exception:
                raise _Closed(True) from None
            return DataPortError(resp.error or "refused", missing=False), False
        resp = parse_response(await _recv_frame(loop, sock))
        if not resp.ok:
            err = resp.error or "unknown error"
            # The server keeps the connection after these two answers only; refusals close it.
            keep = err.startswith(("no such tile", "memory full"))
            return DataPortError(err, missing=err.startswith("no such tile")), keep
        if not receive:
            return resp, True
        assert resp.shape is not None and resp.dtype is not None
        arr = np.empty(resp.shape, dtype=_np_dtype(resp.dtype))
        if resp.bytes:
            await _recv_into(loop, sock, memoryview(arr.reshape(-1).view(np.uint8)))
        return arr, True
