"""The common part of the memory engines: tiles and cache entries in a store of blobs.

:class:`BlobMemoryEngine` is the ``MemoryEngine`` protocol over the accounting of
:mod:`triplane.engines.memory.accounting` (capacity, tiles, reservations, cache entries
evicted least recently used first, the cache counters) and four storage hooks:
``_write(key, array, cache)``, ``_read(key, cache)`` (None if absent), ``_erase(key,
cache)`` and ``_scan()`` (the tiles already stored when the engine starts: that is how a
persistent engine, the file and redis ones, finds what an earlier process of it left).
Tiles and cache entries are two namespaces of the store. The default store is a dict in
this process (the host and device engines); the file and redis engines override the
hooks, and read a stored tile back as a new read-only array. A persistent store may also
hold tiles another engine stored there: ``get`` reads them (uncounted) and
``_stored(key)`` says whether one is there.

The bytes of a tile are counted as its ``nbytes``, whatever the store adds around them.
Thread-safe: a lock guards the accounting and the writes; reads go to the store unlocked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triplane.engines.errors import MissingTileError
from triplane.engines.memory.accounting import LOST_KEPT, CacheAccounts

__all__ = ["BlobMemoryEngine", "LOST_KEPT"]


def host_array(value: Any) -> np.ndarray:
    """``value`` as a C-contiguous numpy array (TypeError for a device array: copy it to the
    host through the device engine, never implicitly)."""
    if type(value).__module__.startswith("cupy"):
        raise TypeError("a device (cupy) array given to a host-side memory engine: copy it to the host "
                        "explicitly (DeviceMemoryEngine.to_host)")
    arr = np.asarray(value)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr).reshape(arr.shape)


class BlobMemoryEngine(CacheAccounts):
    """Tiles (and reclaimable cache entries) in a store of blobs, bounded by ``capacity`` bytes."""

    kind = "blob"

    def __init__(self, capacity: int, name: str) -> None:
        super().__init__(capacity, name)
        self._arrays: dict[tuple[str, bool], Any] = {}  # the default store: (key, cache) -> array

    def _load_existing(self) -> None:
        """Count the tiles the store already holds (call at the end of a subclass's init)."""
        for key, nbytes in self._scan().items():
            self._tiles[key] = nbytes
            self._used += nbytes

    # --- storage hooks (by default, a dict in this process) ------------------------------

    def _prepare(self, value: Any) -> Any:
        """What ``put`` stores of ``value`` (here: a C-contiguous host array)."""
        return host_array(value)

    def _write(self, key: str, arr: Any, cache: bool) -> None:
        self._arrays[(key, cache)] = arr

    def _read(self, key: str, cache: bool) -> Any:
        return self._arrays.get((key, cache))

    def _erase(self, key: str, cache: bool) -> None:
        self._arrays.pop((key, cache), None)

    def _scan(self) -> dict[str, int]:
        return {}

    def _stored(self, key: str) -> bool:
        """Whether the store holds tile ``key`` though this engine did not count it (stored
        by another engine on a shared store)."""
        return False

    # --- tiles ---------------------------------------------------------------------------

    def put(self, key: str, value: np.ndarray, *, reserved: int = 0) -> None:
        """Store ``value`` under ``key``. ``reserved`` bytes previously claimed with
        :meth:`reserve` are consumed by this put (and released even if it fails)."""
        arr = self._prepare(value)
        with self._lock:
            delta = self._admit_locked(key, arr.nbytes, reserved)
            self._write(key, arr, False)
            self._drop_cached_locked(key)  # a tile of that id wins over a cache entry
            self._tiles[key] = arr.nbytes
            self._used += delta

    def get(self, key: str) -> np.ndarray:
        if key in self._tiles or key not in self._cache:  # a tile, or one another engine stored
            arr = self._read(key, False)
            if arr is not None:
                return arr
        with self._lock:
            if key in self._cache:
                arr = self._read(key, True)
                if arr is not None:
                    self._cache.move_to_end(key)
                    return arr
        raise MissingTileError(f"no such tile: {key} (memory engine {self.name!r})")

    def delete(self, key: str) -> None:
        """Forget tile ``key`` (idempotent). On a shared store (a directory, a redis server)
        a tile another engine stored there is deleted too: a release by a process that did
        not write it (the scheduler, for a holder that died) removes it."""
        with self._lock:
            n = self._tiles.pop(key, None)
            if n is not None:
                self._used -= n
                self._erase(key, False)
            elif self._stored(key):
                self._erase(key, False)
            self._drop_cached_locked(key)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or (isinstance(key, str) and self._stored(key))

    def nbytes(self, key: str) -> int:
        """The bytes of tile ``key`` (MissingTileError if not held)."""
        try:
            return self._tiles[key]
        except KeyError:
            raise MissingTileError(f"no such tile: {key} (memory engine {self.name!r})") from None
