"""The host memory engine: tiles as numpy arrays in this process's heap, within a byte capacity.

It implements ``triplane.engines.protocols.MemoryEngine`` (the registry's built-in
``host``); errors from ``triplane.engines.errors``. In short:

* ``put(key, array)`` stores the array (replacing any tile of that key) and accounts its
  ``nbytes``. If it does not fit, ``MemoryFullError`` is raised and nothing changes --
  the caller answers "memory full" (an infra error: the scheduler drifts the task).
* ``get(key)`` returns the stored array, read-only (``MissingTileError`` if absent).
  Stored arrays are never copied on the way out and never written to afterwards, so a
  reader may stream them while other tiles come and go.
* ``delete(key)`` is idempotent: deleting an absent tile is not an error (the scheduler
  may release a tile twice, e.g. after a retransmitted delete).

``reserve``/``release`` let a writer that must allocate before it can ``put`` (the data
port reading a tile off a socket) claim the bytes first, so two concurrent uploads cannot
both pass the capacity check and then overshoot it. Thread-safe: kernels finish in a
worker thread while the event loop serves reads.

**Cache entries.** Besides the tiles the scheduler placed here (released by it), the
engine keeps *cache entries*: copies of immutable data (the executor keeps the uploaded
tensors' tiles it pulled, docs/executor.md) that nobody will release. They share the
capacity, but they are reclaimable: ``put`` and ``reserve`` evict them, least recently
used first, when they need the room, so a cache entry never makes a tile fail to fit.
An entry a running task reads is *in use* (from ``cache_take`` to ``cache_done``) and is
not evicted until its last use ends. Accounting: ``used()`` counts tiles only,
``cached()`` the entries, ``free()`` is what a tile can still get (``capacity - used -
reserved - in-use entries``; evictable entries count as free): that is the figure the
executor publishes to the registry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from triplane.engines.errors import MemoryFullError, MissingTileError

__all__ = ["LOST_KEPT", "HostMemoryEngine"]

LOST_KEPT = 128  # keys of lost cache entries reported (about 6 KiB of upload tile ids)


def _frozen(value: np.ndarray) -> np.ndarray:
    arr = np.asarray(value)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.flags.writeable:  # a view: the caller's own array stays writable
        arr = arr.view()
        arr.flags.writeable = False
    return arr


class HostMemoryEngine:
    """Tiles (and reclaimable cache entries) in host memory, bounded by ``capacity`` bytes (> 0)."""

    kind = "host"

    def __init__(self, capacity: int, name: str = "host") -> None:
        """ValueError unless ``capacity`` is a positive int."""
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
        self.name = name
        self._capacity = capacity
        self._tiles: dict[str, np.ndarray] = {}
        self._used = 0
        self._reserved = 0
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()  # least recently used first
        self._cached = 0
        self._in_use: dict[str, int] = {}  # cache key -> running readers
        self._in_use_bytes = 0
        # evictions: entries evicted for room; refused: not kept for lack of room; dropped:
        # given up by a reader (cache_drop). When any grows, the scheduler forgets the lost
        # entries: those named in _lost, the keys of the last LOST_KEPT losses (oldest
        # first), or all of this node's when more went than are named.
        self.cache_stats = {"stored": 0, "evictions": 0, "evicted_bytes": 0, "refused": 0, "dropped": 0}
        self._lost: deque[str] = deque(maxlen=LOST_KEPT)
        self._lock = threading.Lock()

    # --- the MemoryEngine protocol -----------------------------------------------------

    def put(self, key: str, value: np.ndarray, *, reserved: int = 0) -> None:
        """Store ``value`` under ``key``. ``reserved`` bytes previously claimed with
        :meth:`reserve` are consumed by this put (and released even if it fails)."""
        arr = _frozen(value)
        with self._lock:
            self._reserved -= reserved
            old = self._tiles.get(key)
            delta = arr.nbytes - (old.nbytes if old is not None else 0)
            if not self._make_room_locked(delta):
                raise MemoryFullError(
                    f"memory full: tile {key!r} needs {arr.nbytes} bytes, {self._free_locked()} "
                    f"of {self._capacity} free in memory engine {self.name!r}{self._holders_locked()}")
            self._drop_cached_locked(key)  # a tile of that id wins over a cache entry
            self._tiles[key] = arr
            self._used += delta

    def get(self, key: str) -> np.ndarray:
        arr = self._tiles.get(key)
        if arr is not None:
            return arr
        with self._lock:
            arr = self._cache.get(key)
            if arr is None:
                raise MissingTileError(f"no such tile: {key}")
            self._cache.move_to_end(key)
            return arr

    def delete(self, key: str) -> None:
        with self._lock:
            old = self._tiles.pop(key, None)
            if old is not None:
                self._used -= old.nbytes
            self._drop_cached_locked(key)

    def capacity(self) -> int:
        return self._capacity

    def used(self) -> int:
        """Bytes of tiles (cache entries not counted: see :meth:`cached`)."""
        return self._used

    # --- extras used by the executor ---------------------------------------------------

    def free(self) -> int:
        """Bytes a tile can still get: neither used nor reserved nor held by a cache entry
        in use (evictable cache entries count as free)."""
        with self._lock:
            return self._free_locked()

    def _free_locked(self) -> int:
        return self._capacity - self._used - self._reserved - self._in_use_bytes

    def reserve(self, nbytes: int, key: str | None = None) -> None:
        """Claim ``nbytes`` for a tile about to be ``put`` (pass the same number as
        ``reserved=``), evicting cache entries if need be. If ``key`` is held already, its
        bytes count as available, since the put will replace it. ``MemoryFullError`` if
        they are not free."""
        with self._lock:
            old = self._tiles.get(key) if key is not None else None
            if not self._make_room_locked(nbytes - (old.nbytes if old is not None else 0)):
                raise MemoryFullError(
                    f"memory full: {nbytes} bytes asked, {self._free_locked()} of "
                    f"{self._capacity} free in memory engine {self.name!r}{self._holders_locked()}")
            self._reserved += nbytes

    def _holders_locked(self, top: int = 5) -> str:
        """``; held by: job j1 (64.0 MiB), upload u-2 (...)``: the owners of the most bytes.
        A tile ``<job>.<task>`` is its job's, ``u-<hex>[@region]`` its upload's."""
        by: dict[str, int] = {}
        for key, arr in self._tiles.items():
            owner = key.partition("@")[0] if key.startswith("u-") else key.partition(".")[0]
            by[owner] = by.get(owner, 0) + arr.nbytes
        if not by:
            return ""
        worst = sorted(by.items(), key=lambda kv: -kv[1])[:top]
        named = ", ".join(f"{'upload' if o.startswith('u-') else 'job'} {o} ({n / 2**20:.1f} MiB)"
                          for o, n in worst)
        return (f"; held by: {named} (release results with DELETE /v1/jobs/{{id}}; the SDK does so "
                "when they are read)")

    def release(self, nbytes: int) -> None:
        """Give back a reservation that will not be ``put`` (the upload failed)."""
        with self._lock:
            self._reserved -= nbytes

    def __contains__(self, key: object) -> bool:
        return key in self._tiles or key in self._cache

    def __len__(self) -> int:
        """Tiles held (cache entries not counted)."""
        return len(self._tiles)

    def keys(self) -> list[str]:
        """Ids of the tiles held (cache entries not counted)."""
        return list(self._tiles)

    # --- cache entries -------------------------------------------------------------------

    def cached(self) -> int:
        """Bytes held by cache entries (in use or not)."""
        return self._cached

    def cache_keys(self) -> list[str]:
        """Cache entries, least recently used first."""
        with self._lock:
            return list(self._cache)

    def cache_take(self, key: str) -> np.ndarray | None:
        """The cache entry ``key``, now in use until :meth:`cache_done`; None if not kept."""
        with self._lock:
            arr = self._cache.get(key)
            if arr is None:
                return None
            self._cache.move_to_end(key)
            n = self._in_use.get(key, 0)
            if n == 0:
                self._in_use_bytes += arr.nbytes
            self._in_use[key] = n + 1
            return arr

    def cache_put(self, key: str, value: np.ndarray) -> bool:
        """Keep ``value`` as cache entry ``key`` (not in use); evicts older unused entries
        for room, never a tile nor a reservation. False if it cannot be kept now. An entry
        of that key already kept stays (same immutable data); a tile of that key wins."""
        arr = _frozen(value)
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
            self._cache[key] = arr
            self._cached += arr.nbytes
            self.cache_stats["stored"] += 1
            return True

    def cache_done(self, key: str) -> None:
        """End one use of cache entry ``key`` (begun by :meth:`cache_take`)."""
        with self._lock:
            n = self._in_use.get(key, 0)
            if n <= 0:
                return
            if n > 1:
                self._in_use[key] = n - 1
                return
            del self._in_use[key]
            arr = self._cache.get(key)
            if arr is not None:
                self._in_use_bytes -= arr.nbytes

    def cache_drop(self, key: str) -> None:
        """Forget cache entry ``key`` even while in use (its readers keep their arrays; the
        bytes stop counting here). Tiles are not touched."""
        with self._lock:
            if key in self._cache:
                self.cache_stats["dropped"] += 1
                self._lost.append(key)
            self._drop_cached_locked(key)

    def cache_report(self) -> dict[str, Any]:
        """The cache counters (``cache_stats``) and ``lost``: the keys of the last entries
        lost (evicted, refused or dropped), oldest first -- read together, so the keys are
        the latest of the losses the counters count."""
        with self._lock:
            return {**self.cache_stats, "lost": list(self._lost)}

    def _drop_cached_locked(self, key: str) -> None:
        arr = self._cache.pop(key, None)
        if arr is None:
            return
        self._cached -= arr.nbytes
        if self._in_use.pop(key, 0):  # its readers keep their arrays; the bytes are no longer ours
            self._in_use_bytes -= arr.nbytes

    def _make_room_locked(self, need: int) -> bool:
        """Evict unused cache entries (least recently used first) until ``need`` more bytes
        fit beside the tiles, the reservations and the remaining entries; False if they
        cannot (nothing is evicted then)."""
        if self._used + self._reserved + self._in_use_bytes + need > self._capacity:
            return False
        excess = self._used + self._reserved + self._cached + need - self._capacity
        if excess <= 0:
            return True
        victims = []
        for key, arr in self._cache.items():
            if excess <= 0:
                break
            if key in self._in_use:
                continue
            victims.append(key)
            excess -= arr.nbytes
        for key in victims:
            arr = self._cache.pop(key)
            self._cached -= arr.nbytes
            self.cache_stats["evictions"] += 1
            self.cache_stats["evicted_bytes"] += arr.nbytes
            self._lost.append(key)
        return True
