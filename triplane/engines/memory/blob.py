"""The common part of the memory engines that keep tiles outside this process's heap.

:class:`BlobMemoryEngine` does the accounting the ``MemoryEngine`` protocol asks for
(capacity, tiles, reservations, cache entries evicted least recently used first, the
cache counters) over four storage hooks a subclass implements: ``_write(key, array,
cache)``, ``_read(key, cache)`` (None if absent), ``_erase(key, cache)`` and ``_scan()``
(the tiles already stored when the engine starts: that is how a persistent engine, the
file and redis ones, finds what an earlier process of it left). Tiles and cache entries
are two namespaces of the store; a stored tile is read back as a new read-only array.

The bytes of a tile are counted as its ``nbytes``, whatever the store adds around them.
Thread-safe: a lock guards the accounting and the writes; reads go to the store unlocked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from triplane.engines.errors import MemoryFullError, MissingTileError

__all__ = ["BlobMemoryEngine", "LOST_KEPT"]

LOST_KEPT = 128


def host_array(value: Any) -> np.ndarray:
    """``value`` as a C-contiguous numpy array (TypeError for a device array: copy it to the
    host through the device engine, never implicitly)."""
    if type(value).__module__.startswith("cupy"):
        raise TypeError("a device (cupy) array given to a host-side memory engine: copy it to the host "
                        "explicitly (DeviceMemoryEngine.to_host)")
    arr = np.asarray(value)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr).reshape(arr.shape)


class BlobMemoryEngine:
    """Tiles (and reclaimable cache entries) in a store of blobs, bounded by ``capacity`` bytes."""

    kind = "blob"

    def __init__(self, capacity: int, name: str) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
        self.name = name
        self._capacity = capacity
        self._tiles: dict[str, int] = {}  # key -> nbytes
        self._used = 0
        self._reserved = 0
        self._cache: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._cached = 0
        self._in_use: dict[str, int] = {}
        self._in_use_bytes = 0
        self.cache_stats = {"stored": 0, "evictions": 0, "evicted_bytes": 0, "refused": 0, "dropped": 0}
        self._lost: deque[str] = deque(maxlen=LOST_KEPT)
        self._lock = threading.RLock()

    def _load_existing(self) -> None:
        """Count the tiles the store already holds (call at the end of a subclass's init)."""
        for key, nbytes in self._scan().items():
            self._tiles[key] = nbytes
            self._used += nbytes

    # --- storage hooks -------------------------------------------------------------------

    def _write(self, key: str, arr: np.ndarray, cache: bool) -> None:
        raise NotImplementedError

    def _read(self, key: str, cache: bool) -> np.ndarray | None:
        raise NotImplementedError

    def _erase(self, key: str, cache: bool) -> None:
        raise NotImplementedError

    def _scan(self) -> dict[str, int]:
        return {}

    # --- tiles ---------------------------------------------------------------------------

    def _prepare(self, value: Any) -> Any:
        """What ``put`` stores of ``value`` (here: a C-contiguous host array)."""
        return host_array(value)

    def put(self, key: str, value: np.ndarray, *, reserved: int = 0) -> None:
        arr = self._prepare(value)
        with self._lock:
            self._reserved -= reserved
            delta = arr.nbytes - self._tiles.get(key, 0)
            if not self._make_room_locked(delta):
                raise MemoryFullError(
                    f"memory full: tile {key!r} needs {arr.nbytes} bytes, {self._free_locked()} of "
                    f"{self._capacity} free in memory engine {self.name!r} ({self.kind})")
            self._write(key, arr, False)
            self._drop_cached_locked(key)
            self._tiles[key] = arr.nbytes
            self._used += delta

    def get(self, key: str) -> np.ndarray:
        if key in self._tiles:
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
        with self._lock:
            n = self._tiles.pop(key, None)
            if n is not None:
                self._used -= n
                self._erase(key, False)
            self._drop_cached_locked(key)

    def reserve(self, nbytes: int, key: str | None = None) -> None:
        with self._lock:
            held = self._tiles.get(key, 0) if key is not None else 0
            if not self._make_room_locked(nbytes - held):
                raise MemoryFullError(f"memory full: {nbytes} bytes asked, {self._free_locked()} of "
                                      f"{self._capacity} free in memory engine {self.name!r} ({self.kind})")
            self._reserved += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def __contains__(self, key: object) -> bool:
        return key in self._tiles or key in self._cache

    def __len__(self) -> int:
        return len(self._tiles)

    def keys(self) -> list[str]:
        return list(self._tiles)

    def nbytes(self, key: str) -> int:
        """The bytes of tile ``key`` (MissingTileError if not held)."""
        try:
            return self._tiles[key]
        except KeyError:
            raise MissingTileError(f"no such tile: {key} (memory engine {self.name!r})") from None

    # --- accounting ----------------------------------------------------------------------

    def capacity(self) -> int:
        return self._capacity

    def used(self) -> int:
        return self._used

    def cached(self) -> int:
        return self._cached

    def free(self) -> int:
        with self._lock:
            return self._free_locked()

    def _free_locked(self) -> int:
        return self._capacity - self._used - self._reserved - self._in_use_bytes

    # --- cache entries -------------------------------------------------------------------

    def cache_put(self, key: str, value: np.ndarray) -> bool:
        arr = self._prepare(value)
        with self._lock:
            if key in self._tiles:
                return False
            if key in self._cache:
                self._cache.move_to_end(key)
                return True
            if not self._make_room_locked(arr.nbytes):
                self.cache_stats["refused"] += 1
                self._lost.append(key)
                return False
            self._write(key, arr, True)
            self._cache[key] = arr.nbytes
            self._cached += arr.nbytes
            self.cache_stats["stored"] += 1
            return True

    def cache_take(self, key: str) -> np.ndarray | None:
        with self._lock:
            n = self._cache.get(key)
            if n is None:
                return None
            arr = self._read(key, True)
            if arr is None:  # gone from the store (a TTL ran out): forget it
                self._drop_cached_locked(key)
                self._lost.append(key)
                return None
            self._cache.move_to_end(key)
            users = self._in_use.get(key, 0)
            if users == 0:
                self._in_use_bytes += n
            self._in_use[key] = users + 1
            return arr

    def cache_done(self, key: str) -> None:
        with self._lock:
            users = self._in_use.get(key, 0)
            if users <= 0:
                return
            if users > 1:
                self._in_use[key] = users - 1
                return
            del self._in_use[key]
            n = self._cache.get(key)
            if n is not None:
                self._in_use_bytes -= n

    def cache_drop(self, key: str) -> None:
        with self._lock:
            if key in self._cache:
                self.cache_stats["dropped"] += 1
                self._lost.append(key)
            self._drop_cached_locked(key)

    def cache_keys(self) -> list[str]:
        with self._lock:
            return list(self._cache)

    def cache_report(self) -> dict[str, Any]:
        with self._lock:
            return {**self.cache_stats, "lost": list(self._lost)}

    def _drop_cached_locked(self, key: str) -> None:
        n = self._cache.pop(key, None)
        if n is None:
            return
        self._cached -= n
        self._erase(key, True)
        if self._in_use.pop(key, 0):
            self._in_use_bytes -= n

    def _make_room_locked(self, need: int) -> bool:
        if self._used + self._reserved + self._in_use_bytes + need > self._capacity:
            return False
        excess = self._used + self._reserved + self._cached + need - self._capacity
        victims = []
        for key, n in self._cache.items():
            if excess <= 0:
                break
            if key in self._in_use:
                continue
            victims.append(key)
            excess -= n
        for key in victims:
            n = self._cache.pop(key)
            self._cached -= n
            self._erase(key, True)
            self.cache_stats["evictions"] += 1
            self.cache_stats["evicted_bytes"] += n
            self._lost.append(key)
        return True
