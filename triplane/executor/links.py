"""Measuring this executor's links to each peer, and publishing them per pair.

The executor serves :func:`~triplane.engines.network.measure.probe_handler` on its network
engines (their ports are in its ``engines/network/<node>/<engine>`` records). A
:class:`LinkProber` runs a round every ``interval_s``: for each live peer that serves the
probe engine it

* measures the pair in full (:func:`~triplane.engines.network.measure.measure`: a few
  pings and ``nbytes`` three times, at most ``timeout_s``) when it has no figure yet, when its
  figure is older than ``refresh_s``, or when a cheap ping (best of 3 tiny frames) says
  the latency drifted (over ``drift`` times the figure, or under it by as much, beyond a
  200 µs margin): at most ``max_per_round`` full probes a round, and a pair at most once
  per ``min_gap_s``;
* publishes ``links/<node>/<peer>`` (:class:`~triplane.registry.LinkInfo`) under the
  node's lease, so the pair vanishes with the node; links to peers that left are deleted.

A peer that does not answer is skipped this round (logged once per peer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from triplane.engines.network.base import NetworkEngine, NetworkEngineError
from triplane.engines.network.measure import PROBE_BYTES, measure, ping
from triplane.registry import (
    LinkInfo,
    NodeRegistration,
    RegistryBackend,
    RegistryError,
    list_network_engines,
    list_nodes,
)

__all__ = ["LinkProber"]

log = logging.getLogger(__name__)
_MARGIN_US = 200.0


class LinkProber:
    """Measures ``node``'s links through ``engine`` (see the module doc)."""

    def __init__(self, node: str, engine: NetworkEngine, registry: RegistryBackend,
                 registration: Callable[[], NodeRegistration | None], *, interval_s: float = 5.0,
                 refresh_s: float = 120.0, min_gap_s: float = 10.0, drift: float = 3.0,
                 nbytes: int = PROBE_BYTES, timeout_s: float = 2.0, max_per_round: int = 4) -> None:
        self.node, self.engine, self.registry = node, engine, registry
        self.registration = registration
        self.interval_s, self.refresh_s, self.min_gap_s = interval_s, refresh_s, min_gap_s
        self.drift, self.nbytes, self.timeout_s, self.max_per_round = drift, nbytes, timeout_s, max_per_round
        self.links: dict[str, LinkInfo] = {}
        self.probes = 0          # full probes made
        self.bytes_sent = 0      # bulk bytes those probes sent
        self._last_probe: dict[str, float] = {}
        self._failing: set[str] = set()

    async def run(self) -> None:
        """Rounds forever (cancel to stop); registry outages wait for the next round."""
        while True:
            try:
                await self.round()
            except RegistryError as e:
                log.debug("link round failed: %s", e)
            await asyncio.sleep(self.interval_s)

    async def _peers(self) -> dict[str, tuple[str, int]]:
        addresses = {n.node: n.address for n in await list_nodes(self.registry) if n.node != self.node}
        return {e.node: (addresses[e.node], e.port) for e in await list_network_engines(self.registry)
                if e.node in addresses and e.engine == self.engine.name and e.port > 0}

    async def round(self) -> list[LinkInfo]:
        """One round (see the module doc); the links published in it."""
        reg = self.registration()
        if reg is None:
            return []
        peers = await self._peers()
        for gone in [p for p in self.links if p not in peers]:
            await reg.forget(self.links.pop(gone))
        published, full = [], 0
        now = time.monotonic()
        for peer, (address, port) in sorted(peers.items()):
            try:
                if not await self._due(peer, address, port, now) or full >= self.max_per_round:
                    continue
                full += 1
                self._last_probe[peer] = now
                m = await measure(self.engine, address, port, nbytes=self.nbytes, timeout_s=self.timeout_s)
                self.probes += 1
                self.bytes_sent += 3 * min(self.nbytes, self.engine.max_frame)
            except NetworkEngineError as e:
                if peer not in self._failing:
                    log.warning("link %s -> %s (%s): %s", self.node, peer, self.engine.name, e)
                self._failing.add(peer)
                continue
            self._failing.discard(peer)
            link = LinkInfo(self.node, peer, self.engine.name, m.bandwidth_gbps, m.latency_us, time.time())
            self.links[peer] = link
            await reg.put(link)
            published.append(link)
        return published

    async def _due(self, peer: str, address: str, port: int, now: float) -> bool:
        link = self.links.get(peer)
        if link is None:
            return True
        if now - self._last_probe.get(peer, 0.0) < self.min_gap_s:
            return False
        if time.time() - link.measured_at > self.refresh_s:
            return True
        best = min([await ping(self.engine, address, port, timeout_s=self.timeout_s) for _ in range(3)])
        lat = link.latency_us
        return best > lat * self.drift + _MARGIN_US or best * self.drift + _MARGIN_US < lat
