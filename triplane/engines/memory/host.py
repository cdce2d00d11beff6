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

import numpy as np

from triplane.engines.errors import MissingTileError
from triplane.engines.memory.accounting import LOST_KEPT
from triplane.engines.memory.blob import BlobMemoryEngine

__all__ = ["LOST_KEPT", "HostMemoryEngine"]


def _frozen(value: np.ndarray) -> np.ndarray:
    arr = np.asarray(value)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.flags.writeable:  # a view: the caller's own array stays writable
        arr = arr.view()
        arr.flags.writeable = False
    return arr


class HostMemoryEngine(BlobMemoryEngine):
    """Tiles (and reclaimable cache entries) in host memory, bounded by ``capacity`` bytes (> 0).

    The accounting is :class:`~triplane.engines.memory.blob.BlobMemoryEngine`'s, over its
    default store (a dict of the arrays in this process)."""

    kind = "host"

    def __init__(self, capacity: int, name: str = "host") -> None:
        """ValueError unless ``capacity`` is a positive int."""
        super().__init__(capacity, name)

    def _prepare(self, value: np.ndarray) -> np.ndarray:
        return _frozen(value)

    def get(self, key: str) -> np.ndarray:
        arr = self._arrays.get((key, False))
        if arr is not None:
            return arr
        with self._lock:
            arr = self._arrays.get((key, True))
            if arr is None:
                raise MissingTileError(f"no such tile: {key}")
            self._cache.move_to_end(key)
            return arr

    def _full_detail_locked(self, tile: bool = False) -> str:
        """``; held by: job j1 (64.0 MiB), upload u-2 (...)``: the owners of the most bytes.
        A tile ``<job>.<task>`` is its job's, ``u-<hex>[@region]`` its upload's."""
        by: dict[str, int] = {}
        for key, nbytes in self._tiles.items():
            owner = key.partition("@")[0] if key.startswith("u-") else key.partition(".")[0]
            by[owner] = by.get(owner, 0) + nbytes
        if not by:
            return ""
        worst = sorted(by.items(), key=lambda kv: -kv[1])[:5]
        named = ", ".join(f"{'upload' if o.startswith('u-') else 'job'} {o} ({n / 2**20:.1f} MiB)"
                          for o, n in worst)
        return (f"; held by: {named} (release results with DELETE /v1/jobs/{{id}}; the SDK does so "
                "when they are read)")
