"""The executor's side of the data port: its memory engine as a ``TileSource``.

The server and the client are ``triplane.net.dataport``'s (one implementation for every
node); this adapter serves the engine's tiles and cache entries, takes ``put``s into it
(reserving the bytes first, so concurrent uploads cannot overshoot its capacity) and
deletes from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triplane.engines.errors import MemoryFullError, MissingTileError
from triplane.net.dataport import DataPortError, byte_view
from triplane.proto import dtypes as dt

__all__ = ["EngineTiles"]


class EngineTiles:
    """A memory engine (``get``/``put``/``delete``/``reserve``/``release``) as a tile source."""

    writable = True
    blocking_reads = False  # get() returns the stored array: no copy, no I/O

    def __init__(self, engine: Any, persist: dict[str, Any] | None = None) -> None:
        self.engine = engine
        # Persistence targets (engines/memory/persist.py): a tile the scheduler deletes here
        # is deleted there too (a freed intermediate or a released result of a persisted job).
        self.persist = persist if persist is not None else {}
        # A device engine's tiles go out through its explicit device-to-host copy.
        self._to_host = getattr(engine, "to_host", None)

    def read(self, tile: str) -> tuple[tuple[int, ...], str, memoryview] | None:
        try:
            arr = self.engine.get(tile)
        except MissingTileError:
            return None
        if self._to_host is not None:
            arr = self._to_host(arr)
        return tuple(arr.shape), dt.dtype(arr.dtype).name, byte_view(arr)

    def reserve(self, nbytes: int, tile: str) -> None:
        try:
            self.engine.reserve(nbytes, tile)
        except MemoryFullError as e:
            raise DataPortError(str(e), kind="full") from None

    def release(self, nbytes: int) -> None:
        self.engine.release(nbytes)

    def store(self, tile: str, array: np.ndarray, reserved: int) -> None:
        try:
            self.engine.put(tile, array, reserved=reserved)
        except MemoryFullError as e:
            raise DataPortError(str(e), kind="full") from None

    def delete(self, tile: str) -> None:
        self.engine.delete(tile)
        for target in self.persist.values():
            target.delete(tile)
