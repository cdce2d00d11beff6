"""Socket helpers of the data port (``triplane.net.dataport``): exact reads, tagged chunks,
timeouts turned into ``DataPortError``; shared by its server and its client."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.dataport import CHUNK_BYTES, CHUNK_TAG_BYTES, ChunkMac, DataPortError

__all__ = ["THREAD_MIN_BYTES", "Closed", "byte_view", "check_chunk", "np_dtype", "recv", "recv_chunks",
           "recv_into", "send_chunks", "within"]

T = TypeVar("T")


class Closed(ConnectionError):
    """The peer closed the connection (cleanly if ``at_boundary``: between two frames)."""

    def __init__(self, at_boundary: bool) -> None:
        self.at_boundary = at_boundary
        super().__init__("connection closed by peer")


async def recv_into(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview,
                     first: bool = False) -> None:
    pos, n = 0, len(view)
    while pos < n:
        k = await loop.sock_recv_into(sock, view[pos:])
        if k == 0:
            raise Closed(first and pos == 0)
        pos += k


async def recv(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    await recv_into(loop, sock, memoryview(buf))
    return bytes(buf)


def byte_view(arr: np.ndarray) -> memoryview:
    """The array's bytes, C order little-endian, without copying when it already is."""
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return memoryview(arr.reshape(-1).view(np.uint8))


# Tagging a chunk costs about 0.1 ms per MiB (Poly1305 at ~10 GB/s, plus one HMAC for its
# key); Poly1305 releases the GIL, so a big chunk's tag is computed in a worker thread,
# overlapped with the socket transfer of that chunk (sender) or of the next one (receiver),
# and the event loop keeps serving meanwhile. Below this size the hop costs more than it saves.
THREAD_MIN_BYTES = 256 << 10


async def send_chunks(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview,
                      mac: ChunkMac) -> None:
    for i, pos in enumerate(range(0, len(view), CHUNK_BYTES)):
        chunk = view[pos:pos + CHUNK_BYTES]
        if len(chunk) < THREAD_MIN_BYTES:
            await loop.sock_sendall(sock, chunk)
            await loop.sock_sendall(sock, mac.tag(i, chunk))
            continue
        tag = loop.run_in_executor(None, mac.tag, i, chunk)
        await loop.sock_sendall(sock, chunk)
        await loop.sock_sendall(sock, await tag)


async def check_chunk(loop: asyncio.AbstractEventLoop, mac: ChunkMac, index: int,
                      chunk: memoryview | bytearray, tag: bytes) -> bool:
    """``mac.check``, in a worker thread for a big chunk."""
    if len(chunk) < THREAD_MIN_BYTES:
        return mac.check(index, chunk, tag)
    return await loop.run_in_executor(None, mac.check, index, chunk, tag)


async def recv_chunks(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview,
                      mac: ChunkMac) -> bool:
    """Receive tagged chunks into ``view``; False if a chunk's tag is wrong (each chunk is
    checked while the next one arrives; all are checked before this returns)."""
    pending: asyncio.Future[bool] | None = None
    try:
        for i, pos in enumerate(range(0, len(view), CHUNK_BYTES)):
            chunk = view[pos:pos + CHUNK_BYTES]
            await recv_into(loop, sock, chunk)
            tag = await recv(loop, sock, CHUNK_TAG_BYTES)
            if pending is not None and not await pending:
                return False
            pending = None
            if len(chunk) < THREAD_MIN_BYTES:
                if not mac.check(i, chunk, tag):
                    return False
            else:
                pending = loop.run_in_executor(None, mac.check, i, chunk, tag)
        return pending is None or await pending
    finally:
        if pending is not None and not pending.done():
            pending.cancel()


async def within(aw: Awaitable[T], timeout: float, what: str) -> T:
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise DataPortError(f"{what}: timed out after {timeout:g} s", kind="unavailable") from None


def np_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(dt.BY_NAME[name].np)
