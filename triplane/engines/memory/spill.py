"""Spill: a memory engine that, at capacity, moves its least recently used tiles to a file
engine instead of failing, and reads them back on demand.

``SpillingMemoryEngine(capacity, memory=M, path=DIR)`` has two tiers: a fast one (the
``primary`` engine, ``host`` by default, of ``M`` bytes) and a file engine in
``DIR/spill-<pid>`` (several executors may share DIR; at start, the directories of
processes that are gone are removed)
(:class:`~triplane.engines.memory.file.FileMemoryEngine`; written without ``fsync``:
spilled tiles need not survive a crash, persisted ones are another engine's). Its
``capacity()`` is the bytes of tiles it holds in both tiers together, and that is what it
publishes: placement may plan with tiles that will spill. A ``put`` that does not fit
the fast tier moves that tier's least recently used tiles to the file tier until it
does (a tile larger than the fast tier goes to the file tier directly); a ``get`` of a
spilled tile reads it back (checksum verified) and moves it to the fast tier again.
Cache entries (upload tiles) live in the fast tier only: they are reclaimable, so they
are evicted rather than spilled.

``spill_report()`` gives the counters: ``spills`` and ``spilled_bytes`` (tiles moved to
the file tier), ``reads`` and ``read_bytes`` (tiles read back), and where the bytes are
now (``memory_used``, ``file_used``). The executor puts them in its stats
(``stats/<node>`` in the registry, ``triplane status``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from triplane.engines.errors import MemoryFullError
from triplane.engines.memory.accounting import TileAccounts
from triplane.engines.memory.blob import host_array
from triplane.engines.memory.file import FileMemoryEngine

__all__ = ["SpillingMemoryEngine"]


def _remove_stale(root: Path) -> None:
    """Remove the spill directories of processes that are gone (``spill-<pid>``)."""
    if not root.is_dir():
        return
    for d in root.glob("spill-*"):
        try:
            pid = int(d.name.removeprefix("spill-"))
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


class SpillingMemoryEngine(TileAccounts):
    """``capacity`` bytes of tiles: the fast tier's ``memory`` bytes, the rest spilled to ``path``.

    The accounting (tiles of both tiers, reservations) is :class:`TileAccounts`'s; the cache
    entries are the fast tier's."""

    persistent = False  # its fast tier's tiles die with the process: a reopen finds only spilled ones

    def __init__(self, capacity: int, memory: int | None = None, path: str | None = None,
                 primary: str | Any = "host", name: str = "spill") -> None:
        from triplane.engines.registry import get_memory_engine

        super().__init__(capacity, name)
        memory = capacity if memory is None else int(memory)
        if not 0 < memory <= capacity:
            raise ValueError(f"the fast tier's memory ({memory}) must be in (0, capacity={capacity}]")
        self.primary = get_memory_engine(primary, capacity=memory) if isinstance(primary, str) else primary
        root = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="triplane-spill-"))
        _remove_stale(root)
        self.file = FileMemoryEngine(capacity, path=root / f"spill-{os.getpid()}", name=f"{name}-file",
                                     fsync=False)
        self.kind = f"{self.primary.kind}+file"
        self._fast: OrderedDict[str, None] = OrderedDict()  # tiles in the fast tier, LRU first
        self.counters = {"spills": 0, "spilled_bytes": 0, "reads": 0, "read_bytes": 0}

    # --- tiles ---------------------------------------------------------------------------

    def put(self, key: str, value: np.ndarray, *, reserved: int = 0) -> None:
        arr = value if type(value).__module__.startswith("cupy") else host_array(value)
        with self._lock:
            self._admit_locked(key, arr.nbytes, reserved)
            self._forget_locked(key)
            self._place_locked(key, arr)
            self._tiles[key] = arr.nbytes
            self._used += arr.nbytes

    def _place_locked(self, key: str, arr: Any) -> None:
        if arr.nbytes <= self.primary.capacity():
            while True:
                try:
                    self.primary.put(key, arr)
                    self._fast[key] = None
                    return
                except MemoryFullError:
                    if not self._spill_one_locked():
                        break
        self.file.put(key, arr)
        self._count_spill(arr.nbytes)

    def _spill_one_locked(self) -> bool:
        """Move the fast tier's least recently used tile to the file tier (False: none left)."""
        if not self._fast:
            return False
        victim, _ = self._fast.popitem(last=False)
        arr = self.primary.get(victim)
        self.file.put(victim, self._to_host(arr))
        self.primary.delete(victim)
        self._count_spill(arr.nbytes)
        return True

    def _to_host(self, arr: Any) -> np.ndarray:
        to_host = getattr(self.primary, "to_host", None)
        return to_host(arr) if to_host is not None else arr

    def _count_spill(self, nbytes: int) -> None:
        self.counters["spills"] += 1
        self.counters["spilled_bytes"] += nbytes

    def get(self, key: str) -> np.ndarray:
        with self._lock:
            if key in self._fast:
                self._fast.move_to_end(key)
                return self.primary.get(key)
            if key not in self._tiles:
                return self.primary.get(key)  # a cache entry, or MissingTileError
            arr = self.file.get(key)
            self.counters["reads"] += 1
            self.counters["read_bytes"] += arr.nbytes
            if arr.nbytes <= self.primary.capacity():  # back to the fast tier, others spill
                self.file.delete(key)
                self._place_locked(key, arr)
            return self.primary.get(key) if key in self._fast else arr

    def delete(self, key: str) -> None:
        with self._lock:
            self._forget_locked(key)
            self.primary.delete(key)  # a cache entry of that id goes too

    def _forget_locked(self, key: str) -> None:
        n = self._tiles.pop(key, None)
        if n is None:
            return
        self._used -= n
        if key in self._fast:
            del self._fast[key]
            self.primary.delete(key)
        else:
            self.file.delete(key)

    def __contains__(self, key: object) -> bool:
        return key in self._tiles or key in self.primary

    # --- accounting (reserve, release, free: TileAccounts's) ------------------------------

    def cached(self) -> int:
        return self.primary.cached()

    def _full_detail_locked(self, tile: bool = False) -> str:
        if not tile:
            return f" ({self.kind})"
        return f" ({self.kind}, fast tier {self.primary.capacity()} bytes, spill directory {self.file.path})"

    def _pinned_locked(self) -> int:
        """Bytes of the fast tier's cache entries in use (we never reserve there)."""
        p = self.primary
        return max(p.capacity() - p.used() - p.free(), 0)

    def spill_report(self) -> dict[str, Any]:
        """The spill counters and where the tiles' bytes are now."""
        with self._lock:
            return {**self.counters, "memory_used": self.primary.used(), "file_used": self.file.used(),
                    "path": str(self.file.path)}

    # --- cache entries: the fast tier's ------------------------------------------------------

    def cache_put(self, key: str, value: np.ndarray) -> bool:
        with self._lock:
            if key in self._tiles:
                return False
            return self.primary.cache_put(key, value)

    def cache_take(self, key: str) -> np.ndarray | None:
        return self.primary.cache_take(key)

    def cache_done(self, key: str) -> None:
        self.primary.cache_done(key)

    def cache_drop(self, key: str) -> None:
        self.primary.cache_drop(key)

    def cache_keys(self) -> list[str]:
        return self.primary.cache_keys()

    def cache_report(self) -> dict[str, Any]:
        return self.primary.cache_report()

