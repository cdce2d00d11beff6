"""Which executors keep which upload tiles in their cache: the scheduler's knowledge (pure).

Executors keep the tiles of uploaded tensors they pull (``u-<hex>`` or a region
``u-<hex>@lo:hi,...``) as reclaimable cache entries (docs/executor.md). The scheduler
learns that a node holds one when a task that read it *completes* there (the executor
kept it unless memory was short), and forgets

* everything of a node that goes down (``forget_node``);
* the tiles a node's executor reports it lost since its last report (``evicted``: its
  published counters of entries evicted, refused for lack of room or given up grew; the
  report names the keys of its last ``LOST_KEPT`` (128) losses). When the counters grew
  by more than the names it gives (or it gives none), everything of that node is
  forgotten: a forgotten tile only costs a pull where it could have been local;
* the uploads learned longest ago, beyond ``capacity`` tiles in all (a training loop
  uploads a new batch each step: the map must not grow for ever).

This knowledge only steers placement (``layout.lay_out(..., cached=...)``): the packets
still name the scheduler as the holder of every upload tile, and an executor that no
longer has the tile pulls it. So stale knowledge costs a pull, never a failure.

The map is mutated on the event loop and read by a submit's planning thread
(:meth:`lookup` takes a snapshot under a lock). :func:`read_evictions` is the one piece
of I/O: the executors' eviction counters from the registry (``stats/<node>``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from triplane.scheduler.compiler.jobplan import region_tile
from triplane.scheduler.compiler.layout import Cached
from triplane.scheduler.compiler.tiling import Region

__all__ = ["Residency", "read_evictions"]

DEFAULT_CAPACITY = 65536


class Residency:
    """Upload tile id -> the executors known to keep it cached (sorted, deterministic)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        # upload -> its tiles -> nodes; uploads least recently learned first
        self._uploads: OrderedDict[str, dict[str, set[str]]] = OrderedDict()
        self._tiles = 0
        self._evictions: dict[str, int] = {}
        self._lock = threading.Lock()

    def learn(self, node: str, tiles: Iterable[str]) -> None:
        """A task that read ``tiles`` completed on ``node``: it keeps them now."""
        with self._lock:
            for tile in tiles:
                upload = tile.partition("@")[0]
                entry = self._uploads.get(upload)
                if entry is None:
                    entry = self._uploads[upload] = {}
                else:
                    self._uploads.move_to_end(upload)
                if tile not in entry:
                    entry[tile] = set()
                    self._tiles += 1
                entry[tile].add(node)
            while self._tiles > self.capacity and len(self._uploads) > 1:
                _, old = self._uploads.popitem(last=False)
                self._tiles -= len(old)

    def forget_node(self, node: str) -> None:
        """``node`` is gone (or evicted some of its cache): it holds nothing we know of."""
        with self._lock:
            self._forget_locked(node)

    def _forget_locked(self, node: str) -> None:
        for upload in list(self._uploads):
            entry = self._uploads[upload]
            for tile in [t for t, nodes in entry.items() if node in nodes]:
                entry[tile].discard(node)
                if not entry[tile]:
                    del entry[tile]
                    self._tiles -= 1
            if not entry:
                del self._uploads[upload]

    def evicted(self, node: str, count: int, lost: Sequence[str] = ()) -> None:
        """The executor ``node`` reports ``count`` cache entries lost in all, and ``lost``:
        the keys of its latest losses, oldest first. If the count grew by ``n`` since its
        last report, forget the last ``n`` of ``lost`` there, or all it holds when ``lost``
        names fewer (which went is not known then)."""
        with self._lock:
            grew = count - self._evictions.get(node, 0)
            if 0 < grew <= len(lost):
                self._forget_tiles_locked(node, lost[len(lost) - grew:])
            elif grew > 0:
                self._forget_locked(node)
            self._evictions[node] = count

    def _forget_tiles_locked(self, node: str, tiles: Iterable[str]) -> None:
        for tile in tiles:
            upload = tile.partition("@")[0]
            entry = self._uploads.get(upload)
            nodes = entry.get(tile) if entry is not None else None
            if entry is None or nodes is None or node not in nodes:
                continue
            nodes.discard(node)
            if not nodes:
                del entry[tile]
                self._tiles -= 1
                if not entry:
                    del self._uploads[upload]

    def drop(self, upload: str) -> dict[str, list[str]]:
        """Forget ``upload`` (it was released): node -> the tiles of it known cached there."""
        by_node: dict[str, list[str]] = {}
        with self._lock:
            entry = self._uploads.pop(upload, {})
            self._tiles -= len(entry)
        for tile, nodes in sorted(entry.items()):
            for node in sorted(nodes):
                by_node.setdefault(node, []).append(tile)
        return by_node

    def holders(self, tile: str) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._uploads.get(tile.partition("@")[0], {}).get(tile, ())))

    def __len__(self) -> int:
        """Tiles known to be cached somewhere."""
        return self._tiles

    def lookup(self, args: Sequence[str]) -> Cached:
        """For ``layout.lay_out(..., cached=...)``: (``argN``, region) -> holders, where
        ``args[N]`` is the upload bound to ``argN``. Reads a snapshot of the tiles of
        these uploads (safe to call from another thread while the map changes)."""
        snap: dict[str, tuple[str, ...]] = {}
        with self._lock:
            for upload in set(args):
                for tile, nodes in self._uploads.get(upload, {}).items():
                    snap[tile] = tuple(sorted(nodes))

        def cached(arg: str, region: Region | None) -> tuple[str, ...]:
            try:
                tensor = args[int(arg[3:])]
            except (ValueError, IndexError):
                return ()
            return snap.get(tensor if region is None else region_tile(tensor, region), ())

        return cached


async def read_evictions(registry: Any, residency: Residency) -> None:
    """Feed each executor's published count of cache entries lost (``stats/<node>`` JSON:
    ``cache.evictions + refused + dropped``) and the keys of its latest losses
    (``cache.lost``; absent or malformed: none named) to ``residency``; records without a
    readable count are skipped."""
    from triplane.registry import list_node_stats

    for node, stats in (await list_node_stats(registry)).items():
        try:
            cache = stats["cache"]
            count = sum(int(cache[k]) for k in ("evictions", "refused", "dropped"))
        except (ValueError, KeyError, TypeError):
            continue
        lost = cache.get("lost")
        if not isinstance(lost, list) or not all(isinstance(k, str) for k in lost):
            lost = []
        residency.evicted(node, count, lost)
