"""Uploaded tensors: files in the run directory, served to executors on the data port.

An upload (``POST /v1/tensors``) becomes ``<root>/<id>.npy`` (written with
``allow_pickle=False``; dtypes numpy cannot name, such as bfloat16, are stored as
unsigned integers of the same width) plus ``<id>.json`` holding the shape and dtype that
count. Files are written to a temporary name and renamed, so a crash never leaves a
half tensor under a real id, and a restarted scheduler finds every upload again. An
upload lives until it is released (``DELETE /v1/tensors/{id}``, or the end of the client
session that made it: ``sessions.py``), which deletes both files.

A compiled step's inline inputs (``put(held=True)``) are held in memory only: they live
as long as their job, travel to the executor inside its task packet, and never touch the
disk (a scheduler that restarts under such a job fails it: ``Jobs.resume``). Past
``HELD_TOTAL_BYTES`` of them, a new one is written like any upload.

``UploadTiles`` serves the uploads on the data port (``triplane.net.dataport``'s server,
the one every node runs): ``get`` and ``stat`` only, since uploads come through the REST
API.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.limits import MAX_RANK
from triplane.proto.packet import CARRY_MAX_BYTES, Carried
from triplane.scheduler.compiler.jobplan import is_tensor_id, new_tensor_id

log = logging.getLogger(__name__)

MAX_NDIM = MAX_RANK  # one limit for the whole system (triplane.proto.limits)


class UploadError(ValueError):
    """An upload that cannot be stored: bad shape or dtype header, wrong byte count."""


@dataclass(frozen=True)
class StoredTensor:
    id: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    owner: str | None = None  # the name of the token that uploaded it (None: before owners)

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


SMALL_BYTES = 64 * 1024  # uploads up to this size are also kept in memory (``TensorStore``)
SMALL_TOTAL_BYTES = 64 << 20  # the most bytes kept so (the oldest go first)
HELD_TOTAL_BYTES = 64 << 20  # the most bytes of held (memory-only) uploads; then they are written


class TensorStore:
    """Uploaded tensors under ``root``; ``max_bytes`` bounds one tensor.

    The bytes of a small upload (at most ``SMALL_BYTES``) are also kept in memory, up to
    ``SMALL_TOTAL_BYTES`` in all (the oldest go first), so that serving them costs no file
    read; the files stay the record a restarted scheduler finds. A held upload (a compiled
    step's inline input) has no file: its bytes stay in memory until it is deleted.
    ``put`` and ``delete`` may run in worker threads (a checkpoint's copies, a release's
    file deletions) beside the event loop: the in-memory maps and byte counts change under
    one lock; file I/O is outside it."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = 1 << 30) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._index: dict[str, StoredTensor] = {}
        self._small: dict[str, bytes] = {}  # id -> raw bytes of a written upload (oldest first)
        self._small_bytes = 0
        self._held: dict[str, bytes] = {}  # id -> raw bytes of a held upload (no file)
        self._held_bytes = 0
        self._lock = threading.Lock()  # the maps and counts above (the class doc)
        for meta in self.root.glob("u-*.json"):
            self._load(meta.stem)

    def _load(self, tid: str) -> StoredTensor | None:
        """Index upload ``tid`` from its files, if it has them (written by this process
        before a restart, or by another scheduler sharing the run directory: a standby
        that took over finds the uploads its leader stored)."""
        if not is_tensor_id(tid):
            return None
        meta = self.root / f"{tid}.json"
        try:
            d = json.loads(meta.read_text())
            t = StoredTensor(tid, tuple(d["shape"]), d["dtype"], int(d["bytes"]), d.get("owner"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("skipping unreadable upload %s: %s", meta, e)
            return None
        if not (self.root / f"{tid}.npy").exists():
            return None
        self._index[tid] = t
        return t

    def put(self, data: bytes | bytearray | memoryview, shape: tuple[int, ...], dtype: str,
            owner: str | None = None, *, held: bool = False) -> StoredTensor:
        """Store raw little-endian C-order bytes; UploadError if they do not fit the header.
        ``owner`` (the uploading token's name) may delete it (``DELETE /v1/tensors/{id}``).
        ``held``: a small upload (a compiled step's inline input) is kept in memory only,
        no file written or deleted, while held uploads total at most ``HELD_TOTAL_BYTES``."""
        need = expected_bytes(shape, dtype)
        if len(data) != need:
            raise UploadError(f"{dtype}{list(shape)} is {need} bytes, the body has {len(data)}")
        tid = new_tensor_id()
        t = StoredTensor(tid, shape, dtype, need, owner)
        if held and need <= SMALL_BYTES:
            with self._lock:
                if self._held_bytes + need <= HELD_TOTAL_BYTES:
                    self._held[tid] = bytes(data)
                    self._held_bytes += need
                    self._index[tid] = t
                    return t
        self._write(t, data)
        with self._lock:
            self._index[tid] = t
            if need <= SMALL_BYTES:
                self._keep(tid, bytes(data))
        return t

    def _write(self, t: StoredTensor, data: bytes | bytearray | memoryview) -> None:
        tid = t.id
        arr = np.frombuffer(data, dtype=_storage_dtype(t.dtype)).reshape(t.shape)
        tmp = self.root / f".{tid}.tmp.npy"
        with open(tmp, "wb") as f:
            np.save(f, arr, allow_pickle=False)
        os.replace(tmp, self.root / f"{tid}.npy")
        meta_tmp = self.root / f".{tid}.json.tmp"
        meta_tmp.write_text(json.dumps({"shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes,
                                        "owner": t.owner}))
        os.replace(meta_tmp, self.root / f"{tid}.json")

    def _keep(self, tid: str, raw: bytes) -> None:
        self._small[tid] = raw
        self._small_bytes += len(raw)
        while self._small_bytes > SMALL_TOTAL_BYTES:
            self._small_bytes -= len(self._small.pop(next(iter(self._small))))

    def _raw(self, tid: str) -> bytes | None:
        """The bytes of upload ``tid`` if memory holds them (held, or a small kept one)."""
        raw = self._held.get(tid)
        return self._small.get(tid) if raw is None else raw

    def get(self, tid: str) -> StoredTensor | None:
        t = self._index.get(tid)
        return self._load(tid) if t is None else t

    def data(self, tid: str) -> memoryview:
        """The raw bytes of an upload (memory-mapped); KeyError if unknown."""
        if self.get(tid) is None:
            raise KeyError(tid)
        raw = self._raw(tid)
        if raw is not None:
            return memoryview(raw)
        arr = np.load(self.root / f"{tid}.npy", mmap_mode="r", allow_pickle=False)
        return memoryview(np.ascontiguousarray(arr)).cast("B")

    def array(self, tid: str) -> np.ndarray:
        t = self.get(tid)
        if t is None:
            raise KeyError(tid)
        return np.frombuffer(self.data(tid), dtype=dt.BY_NAME[t.dtype].np).reshape(t.shape)

    def region(self, tile: str) -> tuple[StoredTensor, memoryview] | None:
        """A tile the data server can serve: a whole upload ``u-<hex>``, or a region of one,
        ``u-<hex>@lo:hi,lo:hi`` (one ``lo:hi`` per dimension, within its shape; the bytes
        are copied out of the memory-mapped file, C order). None for anything else:
        unknown, malformed or out of range -- the caller answers "no such tile"."""
        tid, at, spec = tile.partition("@")
        t = self.get(tid)
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
        raw = self._raw(tid)
        if raw is not None:
            arr = np.frombuffer(raw, dtype=_storage_dtype(t.dtype)).reshape(t.shape)
        else:
            arr = np.load(self.root / f"{tid}.npy", mmap_mode="r", allow_pickle=False)
        part_arr = np.ascontiguousarray(arr[tuple(slice(lo, hi) for lo, hi in region)])
        shape = tuple(hi - lo for lo, hi in region)
        return StoredTensor(tile, shape, t.dtype, int(part_arr.nbytes)), memoryview(part_arr).cast("B")

    def delete(self, tid: str) -> bool:
        """Forget an upload and delete its files (a held one has none); whether it was known."""
        with self._lock:
            t = self._index.pop(tid, None)
            raw = self._small.pop(tid, None)
            if raw is not None:
                self._small_bytes -= len(raw)
            raw = self._held.pop(tid, None)
            if raw is not None:
                self._held_bytes -= len(raw)
        if raw is None:
            self._unlink(tid)
        return t is not None

    def _unlink(self, tid: str) -> None:
        for suffix in (".npy", ".json"):
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{tid}{suffix}").unlink()

    def is_held(self, tid: str) -> bool:
        """Is upload ``tid`` held in memory only (a compiled step's inline input)? Its
        :meth:`delete` then does no I/O."""
        return tid in self._held

    def carried(self, tid: str) -> Carried | None:
        """Upload ``tid`` (a whole one) as a task packet carries it, if its bytes are held in
        memory and fit ``CARRY_MAX_BYTES``; else None."""
        raw, t = self._raw(tid), self._index.get(tid)
        if raw is None or t is None or len(raw) > CARRY_MAX_BYTES:
            return None
        return Carried(t.shape, t.dtype, raw)

    def in_memory(self, tid: str) -> bool:
        """Are the bytes of upload ``tid`` (a whole one) in memory?"""
        return tid in self._small or tid in self._held

    def __contains__(self, tid: object) -> bool:
        return isinstance(tid, str) and self.get(tid) is not None

    def __len__(self) -> int:
        return len(self._index)


# --- the uploads on the data port (node "scheduler") ---------------------------------------


class UploadTiles:
    """The uploads of ``store`` as a read-only ``TileSource`` of the data port
    (``triplane.net.dataport.DataServer``): ``get`` and ``stat`` of whole uploads and of
    regions (``TensorStore.region``); ``put`` and ``delete`` are refused (uploads come
    through the REST API only)."""

    writable = False
    # A region is cut in a worker thread: copying it out of a large upload must not stall
    # the event loop (replies, other pulls).
    blocking_reads = True

    def __init__(self, store: TensorStore) -> None:
        self.store = store

    def cheap(self, tile: str) -> bool:
        """A whole small upload is read from memory: no worker thread needed."""
        return self.store.in_memory(tile)

    def read(self, tile: str) -> tuple[tuple[int, ...], str, memoryview] | None:
        found = self.store.region(tile)
        if found is None:
            return None
        t, data = found
        return t.shape, t.dtype, data
