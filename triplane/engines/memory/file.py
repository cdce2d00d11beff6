"""The file memory engine: tiles as files in a directory (a local disk or a shared mount).

``FileMemoryEngine(capacity, path=DIR)`` keeps tile ``k`` in ``DIR/tiles/<name of k>``
and cache entries in ``DIR/cache/`` (emptied at start: they are not kept across
processes). A tile is written atomically: to a temporary file in the same directory,
flushed and ``fsync``'d, renamed over the final name, and the directory is ``fsync``'d;
so a reader (or a later process) sees the whole old tile or the whole new one, never a
part. Each file carries a checksum of its data (:mod:`triplane.engines.memory.codec`),
verified on every read: a damaged file raises ``CorruptTileError`` (a lost tile).

Persistent: an engine started on a directory counts the tiles already there, and a tile
another process stored in the same directory (a shared mount) is read on demand even if
this engine did not write it (it is not counted in ``used()`` then). The spill tier of
:class:`~triplane.engines.memory.spill.SpillingMemoryEngine` and the ``file`` target of
job persistence use this engine.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

import numpy as np

from triplane.engines.memory.blob import BlobMemoryEngine
from triplane.engines.memory.codec import data_bytes, decode, encode_header, nbytes_of

__all__ = ["FileMemoryEngine", "file_name"]


def file_name(key: str) -> str:
    """The file name of tile ``key`` (URL-safe base64 of its UTF-8, reversible)."""
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=") + ".tile"


def _key_of(name: str) -> str | None:
    if not name.endswith(".tile"):
        return None
    stem = name[:-5]
    try:
        return base64.urlsafe_b64decode(stem + "=" * (-len(stem) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


class FileMemoryEngine(BlobMemoryEngine):
    """Tiles as checksummed files under ``path``, bounded by ``capacity`` bytes of tile data."""

    kind = "file"

    def __init__(self, capacity: int, path: str | os.PathLike[str] | None = None, name: str = "file",
                 fsync: bool = True) -> None:
        """``path`` is made if absent (a new temporary directory when None). ``fsync=False``
        skips the flushes to disk (a spill tier whose tiles need not survive a crash)."""
        super().__init__(capacity, name)
        self.path = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="triplane-file-"))
        self.fsync = fsync
        self._dirs = {False: self.path / "tiles", True: self.path / "cache"}
        for d in self._dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        for f in self._dirs[True].iterdir():  # cache entries do not outlive their process
            f.unlink(missing_ok=True)
        self._load_existing()

    def where(self, key: str) -> Path:
        """The file that holds (or would hold) tile ``key``."""
        return self._dirs[False] / file_name(key)

    def _write(self, key: str, arr: np.ndarray, cache: bool) -> None:
        d = self._dirs[cache]
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode_header(key, arr))
                f.write(data_bytes(arr))
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, d / file_name(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self.fsync:
            dfd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _read(self, key: str, cache: bool) -> np.ndarray | None:
        p = self._dirs[cache] / file_name(key)
        try:
            blob = p.read_bytes()
        except FileNotFoundError:
            return None
        _, arr = decode(blob, f"{p} (memory engine {self.name!r})")
        return arr

    def _erase(self, key: str, cache: bool) -> None:
        (self._dirs[cache] / file_name(key)).unlink(missing_ok=True)

    def _scan(self) -> dict[str, int]:
        found = {}
        for f in self._dirs[False].iterdir():
            if f.name.endswith(".tmp"):  # a write that died before its rename
                f.unlink(missing_ok=True)
                continue
            key = _key_of(f.name)
            if key is None:
                continue
            with open(f, "rb") as fh:
                n = nbytes_of(fh.read(4096))
            if n is not None:
                found[key] = n
        return found

    def _stored(self, key: str) -> bool:  # stored by another process on this directory
        return self.where(key).exists()
