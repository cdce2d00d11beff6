"""Deleting tiles on the executors, batched per node: a running job's intermediates (the
service's freer), and a released job's tiles (``Results.releaser``, every
``results.RELEASE_BATCH_S``: a training loop releases one step per step).

The dispatcher's state machine says when a tile may go (``Free``: every task that reads it
is done and it is not fetched; docs/scheduler.md, "Intermediates"). Deleting it is a data
port request (``DataClient.delete``); one per tile would cost the event loop as much as the
task itself, so tiles wait in a queue per node and go in one request per node every
``interval_s`` or as soon as a node has ``batch`` of them, off the per-task path.

A tile queued for deletion whose task is sent again before the flush (a reader ran again
and its input is recomputed from lineage, on the same node) is taken out of the queue
(``sending``), so the deletion cannot remove the new copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from triplane.net.dataport import DataClient

log = logging.getLogger(__name__)

Address = Callable[[str], "tuple[str, int] | None"]  # node -> (host, data port), None if unknown


class TileFreer:
    def __init__(self, client: DataClient, address: Address, *, interval_s: float = 0.005,
                 batch: int = 256) -> None:
        self.client, self.address = client, address
        self.interval_s, self.batch = interval_s, batch
        self._queued: dict[str, dict[str, None]] = {}  # node -> tiles (ordered set)
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.freed = 0  # tiles whose deletion was sent (tests, metrics)

    def free(self, node: str, tile: str) -> None:
        """Queue ``tile`` on ``node`` for deletion (event loop; never blocks)."""
        q = self._queued.setdefault(node, {})
        q[tile] = None
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="tile-freer")
        if len(q) >= self.batch and self._wake is not None:
            self._wake.set()

    def queued_on(self, node: str) -> bool:
        """Whether deletions wait to be sent to ``node``."""
        return bool(self._queued.get(node))

    def sending(self, node: str, tile: str) -> None:
        """``tile`` is about to be made on ``node`` again: do not delete it."""
        q = self._queued.get(node)
        if q:
            q.pop(tile, None)

    async def flush(self) -> None:
        """Send every queued deletion now."""
        queued, self._queued = self._queued, {}
        for node, tiles in queued.items():
            if not tiles:
                continue
            where = self.address(node)
            if where is None:  # gone: its memory went with it
                continue
            self.freed += len(tiles)
            try:
                await self.client.delete(where[0], where[1], list(tiles))
            except Exception as e:  # best effort: the job's release deletes them again
                log.debug("freeing %d tiles on %s failed: %s", len(tiles), node, e)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            if any(self._queued.values()):
                await self.flush()

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
            self._loop_task = None
