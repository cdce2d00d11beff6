"""The redis memory engine: tiles as binary values in a redis-server, under a prefix.

``RedisMemoryEngine(capacity, url="redis://127.0.0.1:6379/0", prefix="triplane")`` keeps
tile ``k`` as the value ``<prefix>:tile:<k>`` and cache entries as ``<prefix>:cache:<k>``
(temporaries: they carry a TTL, ``cache_ttl_s``, so a dead executor's cache entries do
not stay in the server forever; an entry whose TTL ran out is reported lost). Values are
laid out by :mod:`triplane.engines.memory.codec` (header with a checksum, then the data),
checked on every read. Writes of a tile go out in one pipeline (the value and the
removal of a cache entry of that key); ``put_many`` and ``get_many`` move several tiles
in one round trip.

Persistent as far as the server is: an engine started on a prefix counts the tiles
already under it, and any engine on the same server and prefix reads a tile another one
stored (not counted in its ``used()`` then). Needs the ``redis`` package (the
``cluster`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from triplane.engines.errors import MissingTileError
from triplane.engines.memory.blob import BlobMemoryEngine, host_array
from triplane.engines.memory.codec import data_bytes, decode, encode_header, nbytes_of

__all__ = ["RedisMemoryEngine"]


class RedisMemoryEngine(BlobMemoryEngine):
    """Tiles in a redis-server under ``prefix``, bounded by ``capacity`` bytes of tile data."""

    kind = "redis"

    def __init__(self, capacity: int, url: str = "redis://127.0.0.1:6379/0", prefix: str = "triplane",
                 name: str = "redis", cache_ttl_s: float = 3600.0, client: Any = None) -> None:
        super().__init__(capacity, name)
        if client is None:
            import redis

            client = redis.Redis.from_url(url)
        self.url = url
        self.prefix = prefix
        self.cache_ttl_s = cache_ttl_s
        self.client = client
        self._load_existing()

    def _name(self, key: str, cache: bool) -> str:
        return f"{self.prefix}:{'cache' if cache else 'tile'}:{key}"

    def _blob(self, key: str, arr: np.ndarray) -> bytes:
        return encode_header(key, arr) + bytes(data_bytes(arr))

    def _write(self, key: str, arr: np.ndarray, cache: bool) -> None:
        pipe = self.client.pipeline(transaction=True)
        if cache:
            pipe.set(self._name(key, True), self._blob(key, arr), px=int(self.cache_ttl_s * 1000))
        else:
            pipe.set(self._name(key, False), self._blob(key, arr))
            pipe.delete(self._name(key, True))
        pipe.execute()

    def _read(self, key: str, cache: bool) -> np.ndarray | None:
        name = self._name(key, cache)
        blob = self.client.get(name)
        if blob is None:
            return None
        return decode(blob, f"{self.url} key {name!r}")[1]

    def _erase(self, key: str, cache: bool) -> None:
        self.client.delete(self._name(key, cache))

    def _scan(self) -> dict[str, int]:
        found = {}
        start = len(self.prefix) + len(":tile:")
        names = list(self.client.scan_iter(match=f"{self.prefix}:tile:*", count=1000))
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.getrange(name, 0, 4095)
        for name, head in zip(names, pipe.execute()):
            n = nbytes_of(head)
            if n is not None:
                found[name.decode()[start:]] = n
        return found

    def _stored(self, key: str) -> bool:  # stored by another engine on this prefix
        return bool(self.client.exists(self._name(key, False)))

    # --- several tiles per round trip ------------------------------------------------------

    def put_many(self, tiles: Mapping[str, np.ndarray]) -> None:
        """Store several tiles in one pipeline (all or none: MemoryFullError if they do not
        fit together)."""
        arrays = {k: host_array(v) for k, v in tiles.items()}
        with self._lock:
            need = sum(a.nbytes - self._tiles.get(k, 0) for k, a in arrays.items())
            self.reserve(max(need, 0))
            self._reserved -= max(need, 0)
            pipe = self.client.pipeline(transaction=True)
            for k, a in arrays.items():
                pipe.set(self._name(k, False), self._blob(k, a))
                pipe.delete(self._name(k, True))
            pipe.execute()
            for k, a in arrays.items():
                self._drop_cached_locked(k)
                self._used += a.nbytes - self._tiles.get(k, 0)
                self._tiles[k] = a.nbytes

    def get_many(self, keys: Sequence[str]) -> list[np.ndarray]:
        """Several tiles in one round trip (MissingTileError naming the first absent one)."""
        names = [self._name(k, False) for k in keys]
        blobs = self.client.mget(names) if names else []
        out = []
        for k, name, blob in zip(keys, names, blobs):
            if blob is None:
                raise MissingTileError(f"no such tile: {k} (memory engine {self.name!r})")
            out.append(decode(blob, f"{self.url} key {name!r}")[1])
        return out
