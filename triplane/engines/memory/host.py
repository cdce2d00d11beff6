"""The host memory engine: tiles as numpy arrays in this process's heap, within a byte capacity.

Contract (``triplane.engines.protocols.MemoryEngine``):

* ``put(key, array)`` stores the array (replacing any tile of that key) and accounts its
  ``nbytes``. If it does not fit, ``MemoryFullError`` is raised and nothing changes --
  the caller answers "memory full" (an infra error: the scheduler drifts the task).
* ``get(key)`` returns the stored array, read-only (``TileNotFoundError`` if absent).
  Stored arrays are never copied on the way out and never written to afterwards, so a
  reader may stream them while other tiles come and go.
* ``delete(key)`` is idempotent: deleting an absent tile is not an error (the scheduler
  may release a tile twice, e.g. after a retransmitted delete).

``reserve``/``release`` let a writer that must allocate before it can ``put`` (the data
port reading a tile off a socket) claim the bytes first, so two concurrent uploads cannot
both pass the capacity check and then overshoot it. Thread-safe: kernels finish in a
worker thread while the event loop serves reads.
"""

from __future__ import annotations

import threading

import numpy as np

from triplane.proto.errors import TriplaneError

__all__ = ["HostMemoryEngine", "MemoryFullError", "TileNotFoundError"]


class MemoryFullError(TriplaneError, MemoryError):
    """A tile does not fit in the engine's remaining capacity."""


class TileNotFoundError(TriplaneError, KeyError):
    """No tile of that id is held here."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else "no such tile"


class HostMemoryEngine:
    """Tiles in host memory, bounded by ``capacity`` bytes (> 0)."""

    kind = "host"

    def __init__(self, capacity: int, name: str = "host") -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
        self.name = name
        self._capacity = capacity
        self._tiles: dict[str, np.ndarray] = {}
        self._used = 0
        self._reserved = 0
        self._lock = threading.Lock()

    # --- the MemoryEngine protocol -----------------------------------------------------

    def put(self, key: str, value: np.ndarray, *, reserved: int = 0) -> None:
        """Store ``value`` under ``key``. ``reserved`` bytes previously claimed with
        :meth:`reserve` are consumed by this put (and released even if it fails)."""
        arr = np.asarray(value)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        with self._lock:
            self._reserved -= reserved
            old = self._tiles.get(key)
            delta = arr.nbytes - (old.nbytes if old is not None else 0)
            if self._used + self._reserved + delta > self._capacity:
                raise MemoryFullError(
                    f"memory full: tile {key!r} needs {arr.nbytes} bytes, {self._free_locked()} "
                    f"of {self._capacity} free in memory engine {self.name!r}")
            if arr.flags.writeable:  # a view: the caller's own array stays writable
                arr = arr.view()
                arr.flags.writeable = False
            self._tiles[key] = arr
            self._used += delta

    def get(self, key: str) -> np.ndarray:
        try:
            return self._tiles[key]
        except KeyError:
            raise TileNotFoundError(f"no such tile: {key}") from None

    def delete(self, key: str) -> None:
        with self._lock:
            old = self._tiles.pop(key, None)
            if old is not None:
                self._used -= old.nbytes

    def capacity(self) -> int:
        return self._capacity

    def used(self) -> int:
        return self._used

    # --- extras used by the executor ---------------------------------------------------

    def free(self) -> int:
        """Bytes neither used nor reserved."""
        with self._lock:
            return self._free_locked()

    def _free_locked(self) -> int:
        return self._capacity - self._used - self._reserved

    def reserve(self, nbytes: int, key: str | None = None) -> None:
        """Claim ``nbytes`` for a tile about to be ``put`` (pass the same number as
        ``reserved=``). If ``key`` is held already, its bytes count as available, since
        the put will replace it. ``MemoryFullError`` if they are not free."""
        with self._lock:
            old = self._tiles.get(key) if key is not None else None
            available = self._free_locked() + (old.nbytes if old is not None else 0)
            if nbytes > available:
                raise MemoryFullError(
                    f"memory full: {nbytes} bytes asked, {self._free_locked()} of "
                    f"{self._capacity} free in memory engine {self.name!r}")
            self._reserved += nbytes

    def release(self, nbytes: int) -> None:
        """Give back a reservation that will not be ``put`` (the upload failed)."""
        with self._lock:
            self._reserved -= nbytes

    def __contains__(self, key: object) -> bool:
        return key in self._tiles

    def __len__(self) -> int:
        return len(self._tiles)

    def keys(self) -> list[str]:
        return list(self._tiles)
