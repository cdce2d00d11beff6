"""The data port's client (``triplane.net.dataport``; the wire format: ``proto/dataport.md``).

``DataClient`` is what executors pull inputs with and what the scheduler streams results
and releases tiles with. Every response and every data chunk is checked with the cluster
secret before it is used, so a peer without it -- a poisoned registry address, a stranger
-- makes the call fail (``DataPortError`` of kind ``unauthenticated``), never return data.
Every method raises ``DataPortError`` (``kind`` says what); a pooled connection found dead
before any answer is retried once on a fresh one (with a fresh nonce).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from triplane.net.sockio import (
    Closed,
    byte_view,
    check_chunk,
    np_dtype,
    recv,
    recv_chunks,
    recv_into,
    send_chunks,
    within,
)
from triplane.proto import dtypes as dt
from triplane.proto.dataport import (
    CHUNK_BYTES,
    CHUNK_TAG_BYTES,
    LENGTH,
    MAX_DELETE_TILES,
    MAX_RESPONSE_HEADER,
    TAG_BYTES,
    ChunkMac,
    DataPortError,
    Response,
    encode_request,
    parse_response,
    unverified_error,
    verify_response,
)

__all__ = ["DataClient"]


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
                tag = bytearray(CHUNK_TAG_BYTES)
                for i, pos in enumerate(range(0, resp.bytes, CHUNK_BYTES)):
                    buf = bytearray(min(CHUNK_BYTES, resp.bytes - pos))
                    try:
                        await within(recv_into(loop, sock, memoryview(buf)), self.io_timeout, what)
                        await within(recv_into(loop, sock, memoryview(tag)), self.io_timeout, what)
                    except DataPortError:
                        raise
                    except (Closed, OSError) as e:
                        raise DataPortError(f"{what}: connection lost mid-tile ({e})",
                                            kind="unavailable") from None
                    if not await check_chunk(loop, mac, i, buf, bytes(tag)):
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
            await within(loop.sock_connect(sock, (addr, port)), self.connect_timeout,
                          f"connecting to data port {addr}:{port}")
        except OSError as e:
            sock.close()
            raise DataPortError(f"cannot connect to data port {addr}:{port}: {e.strerror or e}",
                                kind="unavailable") from None
        except BaseException:
            sock.close()
            raise
        return sock

    def _drop_idle(self, peer: tuple[str, int]) -> None:
        for sock in self._idle.pop(peer, ()):
            sock.close()

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
                resp = await within(self._exchange(sock, frame, nonce, body, what), self.io_timeout, what)
            except DataPortError:  # a ConnectionError too: before the OSError clause
                sock.close()
                raise
            except Closed as e:
                sock.close()
                if reused and attempt == 0 and e.at_boundary:
                    self._drop_idle(peer)  # the others pooled with it are as old: connect afresh
                    continue  # the pooled connection had died while idle
                raise DataPortError(f"{what}: connection closed by the peer", kind="unavailable") from None
            except OSError as e:
                sock.close()
                if reused and attempt == 0:
                    self._drop_idle(peer)
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
        arr = np.empty(resp.shape, dtype=np_dtype(resp.dtype))
        ok = False
        try:
            loop = asyncio.get_running_loop()
            mac = ChunkMac(self.secret, "get", nonce)
            ok = await within(recv_chunks(loop, sock, memoryview(arr.reshape(-1).view(np.uint8)), mac),
                               self.io_timeout, what)
        except DataPortError:
            raise
        except (Closed, OSError) as e:
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
                await send_chunks(loop, sock, body, ChunkMac(self.secret, "put", nonce))
        except OSError:
            # The server may have refused the header and closed: its answer says why.
            try:
                return await asyncio.wait_for(self._response(loop, sock, nonce, what), 1.0)
            except DataPortError:
                raise
            except (asyncio.TimeoutError, OSError, Closed):
                raise Closed(True) from None
        return await self._response(loop, sock, nonce, what)

    async def _response(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, nonce: bytes,
                        what: str) -> Response:
        head = bytearray(LENGTH.size)
        await recv_into(loop, sock, memoryview(head), first=True)
        (n,) = LENGTH.unpack(head)
        if not 0 < n <= MAX_RESPONSE_HEADER:
            raise DataPortError(f"{what}: the peer broke the protocol (response header of {n} bytes): "
                                "not a triplane data port?", kind="protocol")
        body = await recv(loop, sock, TAG_BYTES + n)
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
