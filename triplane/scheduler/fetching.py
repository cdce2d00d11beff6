"""Fetching a tensor held in several tiles: streamed in row-major order, slab by slab.

A tiled output is never gathered whole, on an executor or here: the scheduler reads the
tiles of one *slab* (the tiles sharing a first-dimension interval) from the executors
holding them, writes that slab's rows in C order, sends it, and moves on. Peak memory
here is one slab (for a ``r x c`` grid of an ``M x N`` tensor, ``M / r x N`` elements).
The bytes are those of the whole tensor in C order, little-endian: a client reads a tiled
tensor exactly as an untiled one (``GET /v1/jobs/{id}/tensors/{name}``, same headers).

Failure semantics: a tile whose holder is unknown is refused before the first byte
(``FetchError``, the API's 404); a holder failing mid-stream ends the stream early (the
client sees fewer bytes than ``Content-Length``, an error for any HTTP client).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from triplane.net.dataport import DataClient, DataPortError
from triplane.scheduler.compiler.tiling import TileGrid
from triplane.scheduler.store import _storage_dtype, expected_bytes

__all__ = ["FetchError", "open_tiled"]

CHUNK_BYTES = 8 << 20


class FetchError(LookupError):
    """A tile of the tensor has no live holder (``tile`` names it)."""

    def __init__(self, message: str, tile: str) -> None:
        super().__init__(message)
        self.tile = tile


Holder = Callable[[str], "tuple[str, int] | None"]  # tile id -> (address, data port) of its holder
# tile id -> whether a persistence target keeps it, and its copy read from there (or None)
Kept = tuple[Callable[[str], bool], Callable[[str], Awaitable["np.ndarray | None"]]]


async def read_tile(client: DataClient, address: str, port: int, tile: str,
                    shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """One tile as an array (its bytes checked against the expected shape)."""
    got_shape, _, nbytes, chunks = await client.open_tile(address, port, tile)
    buf = bytearray()
    async for part in chunks:
        buf += part
    if tuple(got_shape) != tuple(shape) or len(buf) != nbytes:
        raise ValueError(f"tile {tile} is {list(got_shape)} ({len(buf)} bytes), expected {list(shape)}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


async def open_tiled(client: DataClient, grid: TileGrid, tile_ids: Mapping[str, str],
                     holder: Holder, kept: Kept | None = None
                     ) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
    """(shape, dtype, bytes, chunks) of the tensor of ``grid``; ``tile_ids`` maps each
    cell's task to its tile id, ``holder`` a tile id to where it is, ``kept`` reads a tile
    whose holder is gone from a persistence target (docs/storage.md). FetchError at once
    if a tile has neither."""
    where: dict[tuple[int, ...], tuple[str, str, int]] = {}
    from_target: set[str] = set()  # read there when its slab is written, not all at once
    for cell in grid.cells():
        tile = tile_ids[grid.tiles[cell]]
        at = holder(tile)
        if at is None:
            if kept is None or not kept[0](tile):
                raise FetchError(f"tile {tile} has no live holder", tile)
            from_target.add(tile)
            at = ("", 0)
        where[cell] = (tile, *at)
    shape, dtype = tuple(grid.shape), grid.dtype
    np_dtype = _storage_dtype(dtype)
    nbytes = expected_bytes(shape, dtype)

    async def chunks() -> AsyncIterator[bytes]:
        async def read(tile: str, addr: str, port: int, part_shape: tuple[int, ...]) -> np.ndarray:
            if tile not in from_target:
                try:
                    return await read_tile(client, addr, port, tile, part_shape, np_dtype)
                except DataPortError:  # its holder died (not noticed yet): a persisted copy?
                    if kept is None or not kept[0](tile):
                        raise
            arr = await kept[1](tile) if kept is not None else None
            if arr is None or tuple(arr.shape) != part_shape:
                raise ValueError(f"tile {tile} is not in the persistence target as expected")
            return arr

        if not shape:  # 0-d: one tile
            tile, addr, port = where[()]
            yield (await read(tile, addr, port, ())).tobytes()
            return
        counts = grid.counts
        for i in range(counts[0]):
            lo, hi = grid.bounds[0][i], grid.bounds[0][i + 1]
            slab = np.empty((hi - lo, *shape[1:]), dtype=np_dtype)
            for cell in grid.cells():
                if cell[0] != i:
                    continue
                region = grid.region(cell)
                tile, addr, port = where[cell]
                part_shape = tuple(b - a for a, b in region)
                part = await read(tile, addr, port, part_shape)
                slab[(slice(0, hi - lo), *(slice(a, b) for a, b in region[1:]))] = part
                del part
            view = memoryview(slab).cast("B")
            for k in range(0, len(view), CHUNK_BYTES):  # bounded copies, not a second slab
                yield bytes(view[k:k + CHUNK_BYTES])
            del view, slab

    return shape, dtype, nbytes, chunks()
