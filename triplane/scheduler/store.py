"""Uploaded tensors: files in the run directory, served to executors on the data port.

An upload (``POST /v1/tensors``) becomes ``<root>/<id>.npy`` (written with
``allow_pickle=False``; dtypes numpy cannot name, such as bfloat16, are stored as
unsigned integers of the same width) plus ``<id>.json`` holding the shape and dtype that
count. Files are written to a temporary name and renamed, so a crash never leaves a
half tensor under a real id, and a restarted scheduler finds every upload again.

The data server speaks the data-port protocol of docs/runtime.md (via
``triplane.executor.datawire``) for ``get`` and ``stat``; ``put`` and ``delete`` are
refused (uploads come through the REST API only). A bad request is answered with
``ok: false`` and the connection is closed if the stream lost sync; the server never
dies from one client. ``DataPortClient`` is the other side: the scheduler uses it to
stream fetched tiles from executors and to release tiles when a job ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from triplane.executor.datawire import (
    HEADER,
    MAX_HEADER_BYTES,
    DataPortError,
    make_request,
    make_response,
    parse_request,
    parse_response,
)
from triplane.proto import dtypes as dt
from triplane.proto.limits import MAX_RANK
from triplane.scheduler.compiler.jobplan import is_tensor_id, new_tensor_id

log = logging.getLogger(__name__)

MAX_NDIM = MAX_RANK  # one limit for the whole system (triplane.proto.limits)
CHUNK = 1 << 20


class UploadError(ValueError):
    """An upload that cannot be stored: bad shape or dtype header, wrong byte count."""


@dataclass(frozen=True)
class StoredTensor:
    id: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "shape": list(self.shape), "dtype": self.dtype, "bytes": self.nbytes}


def parse_shape(text: str) -> tuple[int, ...]:
    """``"64,784"`` -> (64, 784); ``""`` -> () (a 0-d tensor). UploadError otherwise."""
    text = text.strip()
    if not text:
        return ()
    try:
        shape = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise UploadError(f"X-Triplane-Shape must be comma-separated integers, got {text[:80]!r}") from None
    if len(shape) > MAX_NDIM or any(s < 0 for s in shape):
        raise UploadError(f"X-Triplane-Shape {text[:80]!r}: at most {MAX_NDIM} non-negative sizes")
    return shape


def parse_dtype(text: str) -> str:
    if text not in dt.BY_NAME:
        raise UploadError(f"unknown X-Triplane-Dtype {text[:40]!r} (known: {sorted(dt.BY_NAME)})")
    return text


def expected_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * dt.BY_NAME[dtype].itemsize


def _storage_dtype(dtype: str) -> np.dtype:
    """A numpy dtype ``np.save`` writes without pickling (bfloat16 -> uint16)."""
    d = np.dtype(dt.BY_NAME[dtype].np).newbyteorder("<")
    if d.kind not in "biuf":
        return np.dtype(f"<u{d.itemsize}")
    return d


class TensorStore:
    """Uploaded tensors under ``root``; ``max_bytes`` bounds one tensor."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = 1 << 30) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._index: dict[str, StoredTensor] = {}
        for meta in self.root.glob("u-*.json"):
            try:
                d = json.loads(meta.read_text())
                t = StoredTensor(meta.stem, tuple(d["shape"]), d["dtype"], int(d["bytes"]))
                if is_tensor_id(t.id) and (self.root / f"{t.id}.npy").exists():
                    self._index[t.id] = t
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("skipping unreadable upload %s: %s", meta, e)

    def put(self, data: bytes | bytearray | memoryview, shape: tuple[int, ...], dtype: str) -> StoredTensor:
        """Store raw little-endian C-order bytes; UploadError if they do not fit the header."""
        need = expected_bytes(shape, dtype)
        if len(data) != need:
            raise UploadError(f"{dtype}{list(shape)} is {need} bytes, the body has {len(data)}")
        tid = new_tensor_id()
        arr = np.frombuffer(data, dtype=_storage_dtype(dtype)).reshape(shape)
        tmp = self.root / f".{tid}.tmp.npy"
        with open(tmp, "wb") as f:
            np.save(f, arr, allow_pickle=False)
        os.replace(tmp, self.root / f"{tid}.npy")
        t = StoredTensor(tid, shape, dtype, need)
        meta_tmp = self.root / f".{tid}.json.tmp"
        meta_tmp.write_text(json.dumps({"shape": list(shape), "dtype": dtype, "bytes": need}))
        os.replace(meta_tmp, self.root / f"{tid}.json")
        self._index[tid] = t
        return t

    def get(self, tid: str) -> StoredTensor | None:
        return self._index.get(tid)

    def data(self, tid: str) -> memoryview:
        """The raw bytes of an upload (memory-mapped); KeyError if unknown."""
        if tid not in self._index:
            raise KeyError(tid)
        arr = np.load(self.root / f"{tid}.npy", mmap_mode="r", allow_pickle=False)
        return memoryview(np.ascontiguousarray(arr)).cast("B")

    def array(self, tid: str) -> np.ndarray:
        t = self._index[tid]
        return np.frombuffer(self.data(tid), dtype=dt.BY_NAME[t.dtype].np).reshape(t.shape)

    def region(self, tile: str) -> tuple[StoredTensor, memoryview] | None:
        """A tile the data server can serve: a whole upload ``u-<hex>``, or a region of one,
        ``u-<hex>@lo:hi,lo:hi`` (one ``lo:hi`` per dimension, within its shape; the bytes
        are copied out of the memory-mapped file, C order). None for anything else:
        unknown, malformed or out of range -- the caller answers "no such tile"."""
        tid, at, spec = tile.partition("@")
        t = self._index.get(tid)
        if t is None:
            return None
        if not at:
            return t, self.data(tid)
        parts = spec.split(",")
        if len(parts) != len(t.shape):
            return None
        region = []
        for part, n in zip(parts, t.shape):
            lo_s, colon, hi_s = part.partition(":")
            if not colon or not lo_s.isdigit() or not hi_s.isdigit():
                return None
            lo, hi = int(lo_s), int(hi_s)
            if not 0 <= lo <= hi <= n:
                return None
            region.append((lo, hi))
        arr = np.load(self.root / f"{tid}.npy", mmap_mode="r", allow_pickle=False)
        part_arr = np.ascontiguousarray(arr[tuple(slice(lo, hi) for lo, hi in region)])
        shape = tuple(hi - lo for lo, hi in region)
        return StoredTensor(tile, shape, t.dtype, int(part_arr.nbytes)), memoryview(part_arr).cast("B")

    def delete(self, tid: str) -> bool:
        t = self._index.pop(tid, None)
        for suffix in (".npy", ".json"):
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{tid}{suffix}").unlink()
        return t is not None

    def __contains__(self, tid: object) -> bool:
        return tid in self._index

    def __len__(self) -> int:
        return len(self._index)


# --- the data server (node "scheduler") ---------------------------------------------------


class DataServer:
    """Serves ``store`` on the data port: ``get`` and ``stat`` of uploaded tensors."""

    def __init__(self, store: TensorStore, secret: bytes) -> None:
        self.store = store
        self.secret = secret
        self.refused = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readexactly(HEADER.size)
                except asyncio.IncompleteReadError:
                    return
                (n,) = HEADER.unpack(head)
                if not 0 < n <= MAX_HEADER_BYTES:
                    self.refused += 1
                    writer.write(make_response(False, f"bad frame length {n}"))
                    await writer.drain()
                    return  # the stream lost sync
                payload = await reader.readexactly(n)
                try:
                    req = parse_request(payload, self.secret)
                except DataPortError as e:
                    self.refused += 1
                    writer.write(make_response(False, str(e)))
                    await writer.drain()
                    continue
                if req.op not in ("get", "stat"):
                    self.refused += 1
                    writer.write(make_response(False, f"the scheduler's data port is read-only ({req.op})"))
                    return  # a put's body would follow: do not read it as a header
                # A region is cut in a worker thread: copying it out of a large upload
                # must not stall the event loop (replies, other pulls).
                found = await asyncio.to_thread(self.store.region, req.tile or "")
                if found is None:
                    writer.write(make_response(False, f"no such tile: {req.tile}"))
                    await writer.drain()
                    continue
                t, data = found
                writer.write(make_response(True, shape=t.shape, dtype=t.dtype, nbytes=t.nbytes))
                if req.op == "get":
                    writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            writer.close()


# --- the client side: fetching tiles from executors and releasing them ------------------------


class DataPortClient:
    """Data-port requests to executors (docs/runtime.md). Every failure raises
    ``DataPortError`` (``missing`` when the peer does not hold the tile)."""

    def __init__(self, secret: bytes, timeout_s: float = 10.0) -> None:
        self.secret = secret
        self.timeout_s = timeout_s

    async def _response(self, reader: asyncio.StreamReader) -> tuple[int, bytes]:
        (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        if not 0 < n <= MAX_HEADER_BYTES:
            raise DataPortError(f"malformed response: frame length {n}")
        return n, await reader.readexactly(n)

    async def open_tile(
        self, address: str, port: int, tile: str
    ) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
        """(shape, dtype, bytes, chunks) of ``tile``; iterate ``chunks`` to the end (it closes
        the connection)."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), self.timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise DataPortError(f"cannot reach data port {address}:{port}: {e}") from None
        try:
            writer.write(make_request("get", self.secret, tile=tile))
            _, payload = await asyncio.wait_for(self._response(reader), self.timeout_s)
            resp = parse_response(payload)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            writer.close()
            raise DataPortError(f"data port {address}:{port}: {e or type(e).__name__}") from None
        except DataPortError:
            writer.close()
            raise
        if not resp.ok:
            writer.close()
            raise DataPortError(str(resp.error), missing=str(resp.error).startswith("no such tile"))
        assert resp.shape is not None and resp.dtype is not None

        async def chunks() -> AsyncIterator[bytes]:
            left = resp.bytes
            try:
                while left > 0:
                    part = await asyncio.wait_for(reader.read(min(left, CHUNK)), self.timeout_s)
                    if not part:
                        raise DataPortError(f"data port {address}:{port} closed mid-tile")
                    left -= len(part)
                    yield part
            finally:
                writer.close()

        return resp.shape, resp.dtype, resp.bytes, chunks()

    async def delete(self, address: str, port: int, tiles: list[str]) -> None:
        """Release ``tiles`` on one executor (chunks of at most 4096 per request)."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), self.timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise DataPortError(f"cannot reach data port {address}:{port}: {e}") from None
        try:
            for i in range(0, len(tiles), 4096):
                writer.write(make_request("delete", self.secret, tiles=tuple(tiles[i : i + 4096])))
                _, payload = await asyncio.wait_for(self._response(reader), self.timeout_s)
                resp = parse_response(payload)
                if not resp.ok:
                    raise DataPortError(str(resp.error))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            raise DataPortError(f"data port {address}:{port}: {e or type(e).__name__}") from None
        finally:
            writer.close()
