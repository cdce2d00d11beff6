"""The byte accounting of the memory engines, written once.

:class:`TileAccounts` counts tiles (key -> bytes) and reservations within a capacity:
``reserve``/``release``, ``used``/``free``, ``keys``; it is the base of
:class:`~triplane.engines.memory.spill.SpillingMemoryEngine`, whose cache entries are
its fast tier's. :class:`CacheAccounts` adds the cache entries (reclaimable copies of
upload tiles): the entries in use (``cache_take`` .. ``cache_done``), eviction least
recently used first to make room, and the cache counters with the keys of the last
entries lost. It stores and erases an entry's bytes through the storage hooks of
:class:`~triplane.engines.memory.blob.BlobMemoryEngine`, the base of every engine that
keeps cache entries (host, file, redis, device).

Both count a tile's or an entry's bytes as its ``nbytes``, whatever the store adds. A
subclass makes ``self._lock`` (an ``RLock``) guard every change; ``*_locked`` methods
are called with it held.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

from triplane.engines.errors import MemoryFullError

__all__ = ["LOST_KEPT", "CacheAccounts", "TileAccounts"]

LOST_KEPT = 128  # keys of lost cache entries reported (about 6 KiB of upload tile ids)


class TileAccounts:
    """Tiles and reservations within ``capacity`` bytes (a positive int)."""

    kind: str  # set by the engine (class or instance)

    def __init__(self, capacity: int, name: str) -> None:
        """ValueError unless ``capacity`` is a positive int."""
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
        self.name = name
        self._capacity = capacity
        self._tiles: dict[str, int] = {}  # key -> nbytes
        self._used = 0
        self._reserved = 0
        self._lock = threading.RLock()

    # --- what a subclass refines -----------------------------------------------------------

    def _pinned_locked(self) -> int:
        """Bytes held besides the tiles and the reservations that cannot be given back now
        (cache entries in use)."""
        return 0

    def _make_room_locked(self, need: int) -> bool:
        """Whether ``need`` more bytes fit (a subclass may evict to make them fit)."""
        return self._used + self._reserved + self._pinned_locked() + need <= self._capacity

    def _full_detail_locked(self, tile: bool = False) -> str:
        """What a "memory full" error adds after the engine's name (``tile``: a put's)."""
        return f" ({self.kind})"

    # --- tiles and reservations ----------------------------------------------------------

    def capacity(self) -> int:
        return self._capacity

    def used(self) -> int:
        """Bytes of tiles (cache entries not counted)."""
        return self._used

    def free(self) -> int:
        """Bytes a tile can still get: neither used nor reserved nor held by a cache entry
        in use (evictable cache entries count as free)."""
        with self._lock:
            return self._free_locked()

    def _free_locked(self) -> int:
        return self._capacity - self._used - self._reserved - self._pinned_locked()

    def reserve(self, nbytes: int, key: str | None = None) -> None:
        """Claim ``nbytes`` for a tile about to be ``put`` (pass the same number as
        ``reserved=``), evicting cache entries if need be. If ``key`` is held already, its
        bytes count as available, since the put will replace it. ``MemoryFullError`` if
        they are not free."""
        with self._lock:
            held = self._tiles.get(key, 0) if key is not None else 0
            if not self._make_room_locked(nbytes - held):
                raise MemoryFullError(
                    f"memory full: {nbytes} bytes asked, {self._free_locked()} of {self._capacity} "
                    f"free in memory engine {self.name!r}{self._full_detail_locked()}")
            self._reserved += nbytes

    def _admit_locked(self, key: str, nbytes: int, reserved: int) -> int:
        """The start of a ``put`` of ``nbytes`` under ``key``: consume the ``reserved`` bytes
        and make room for the difference to the tile it replaces, which is returned.
        ``MemoryFullError`` if it does not fit (the reservation is gone all the same)."""
        self._reserved -= reserved
        delta = nbytes - self._tiles.get(key, 0)
        if not self._make_room_locked(delta):
            raise MemoryFullError(
                f"memory full: tile {key!r} needs {nbytes} bytes, {self._free_locked()} of {self._capacity} "
                f"free in memory engine {self.name!r}{self._full_detail_locked(tile=True)}")
        return delta

    def release(self, nbytes: int) -> None:
        """Give back a reservation that will not be ``put`` (the upload failed)."""
        with self._lock:
            self._reserved -= nbytes

    def __len__(self) -> int:
        """Tiles held (cache entries not counted)."""
        return len(self._tiles)

    def keys(self) -> list[str]:
        """Ids of the tiles held (cache entries not counted)."""
        return list(self._tiles)


class CacheAccounts(TileAccounts):
    """:class:`TileAccounts` and reclaimable cache entries, stored through the hooks
    ``_prepare(value)``, ``_write(key, arr, cache)``, ``_read(key, cache)`` (None if absent)
    and ``_erase(key, cache)`` (``cache`` is True for an entry)."""

    def __init__(self, capacity: int, name: str) -> None:
        super().__init__(capacity, name)
        self._cache: OrderedDict[str, int] = OrderedDict()  # key -> nbytes, least recently used first
        self._cached = 0
        self._in_use: dict[str, int] = {}  # cache key -> running readers
        self._in_use_bytes = 0
        # evictions: entries evicted for room; refused: not kept for lack of room; dropped:
        # given up by a reader (cache_drop). When any grows, the scheduler forgets the lost
        # entries: those named in _lost, the keys of the last LOST_KEPT losses (oldest
        # first), or all of this node's when more went than are named.
        self.cache_stats = {"stored": 0, "evictions": 0, "evicted_bytes": 0, "refused": 0, "dropped": 0}
        self._lost: deque[str] = deque(maxlen=LOST_KEPT)

    # --- storage hooks -------------------------------------------------------------------

    def _prepare(self, value: Any) -> Any:
        raise NotImplementedError

    def _write(self, key: str, arr: Any, cache: bool) -> None:
        raise NotImplementedError

    def _read(self, key: str, cache: bool) -> Any:
        raise NotImplementedError

    def _erase(self, key: str, cache: bool) -> None:
        raise NotImplementedError

    # --- cache entries -------------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return key in self._tiles or key in self._cache

    def cached(self) -> int:
        """Bytes held by cache entries (in use or not)."""
        return self._cached

    def cache_keys(self) -> list[str]:
        """Cache entries, least recently used first."""
        with self._lock:
            return list(self._cache)

    def cache_put(self, key: str, value: Any) -> bool:
        """Keep ``value`` as cache entry ``key`` (not in use); evicts older unused entries
        for room, never a tile nor a reservation. False if it cannot be kept now. An entry
        of that key already kept stays (same immutable data); a tile of that key wins."""
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

    def cache_take(self, key: str) -> Any:
        """The cache entry ``key``, now in use until :meth:`cache_done`; None if not kept
        (or gone from the store: a TTL ran out; it is forgotten and reported lost then)."""
        with self._lock:
            n = self._cache.get(key)
            if n is None:
                return None
            arr = self._read(key, True)
            if arr is None:
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
        """End one use of cache entry ``key`` (begun by :meth:`cache_take`)."""
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
        n = self._cache.pop(key, None)
        if n is None:
            return
        self._cached -= n
        self._erase(key, True)
        if self._in_use.pop(key, 0):  # its readers keep their arrays; the bytes are no longer ours
            self._in_use_bytes -= n

    def _pinned_locked(self) -> int:
        return self._in_use_bytes

    def _make_room_locked(self, need: int) -> bool:
        """Evict unused cache entries (least recently used first) until ``need`` more bytes
        fit beside the tiles, the reservations and the remaining entries; False if they
        cannot (nothing is evicted then)."""
        if not super()._make_room_locked(need):
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
