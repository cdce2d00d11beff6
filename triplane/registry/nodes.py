"""Registering a node (with its engines) under a lease, and reading who is alive.

``register_node`` writes every record of a node bound to one lease and keeps the lease
alive in a background task, so a node that dies (SIGKILL, power loss, partition) vanishes
from the registry within about its TTL without anyone cleaning up. If the lease is found
gone while the process lives (the etcd cluster was wiped or restarted from an old
snapshot, or a long pause let it expire), the task grants a new lease and writes
every record again; :attr:`NodeRegistration.reregistrations` counts that.

Readers (``list_nodes`` and friends) skip malformed values with a warning: one bad
writer must not blind the scheduler to every other node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from triplane.registry.backend import LeaseNotFound, RegistryBackend, RegistryUnavailable
from triplane.registry.records import (
    Binding,
    Drained,
    LinkInfo,
    MemoryEngineInfo,
    NetworkEngineInfo,
    NodeInfo,
    OpEngineInfo,
    Record,
    RecordError,
    check_name,
    decode,
    encode,
)

__all__ = [
    "NodeEvent",
    "NodeRegistration",
    "list_bindings",
    "list_drained",
    "list_links",
    "list_memory_engines",
    "list_network_engines",
    "list_nodes",
    "list_op_engines",
    "register_node",
    "set_drained",
    "watch_nodes",
]

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Record)


class NodeRegistration:
    """A node's live registration: its records, its lease and the keep-alive task.

    Use :func:`register_node` to make one. :meth:`close` deregisters at once (revokes the
    lease); :meth:`abandon` only stops refreshing, as if the process had died.
    """

    def __init__(self, backend: RegistryBackend, node: NodeInfo, records: list[Record], ttl_s: float) -> None:
        self.backend = backend
        self.node = node
        self.ttl_s = ttl_s
        self.lease = 0
        self.reregistrations = 0
        # Node key last: whoever sees the node also finds its engines and bindings.
        self._records: dict[str, bytes] = {r.key(): encode(r) for r in records}
        self._records[node.key()] = encode(node)
        self._task: asyncio.Task[None] | None = None
        self.registered = asyncio.Event()

    async def _write_all(self) -> None:
        self.lease = await self.backend.grant_lease(self.ttl_s)
        # A snapshot of the keys: ``put``/``forget`` may change the records while a put
        # waits (an executor's links come and go); each is written as it is now, if kept.
        for key in list(self._records):
            value = self._records.get(key)
            if value is not None:
                await self.backend.put(key, value, lease=self.lease)
        self.registered.set()

    async def _keep_alive(self) -> None:
        period = self.ttl_s / 3.0
        while True:
            await asyncio.sleep(period)
            try:
                await self.backend.refresh_lease(self.lease)
            except LeaseNotFound:
                self.registered.clear()
                log.warning("node %s: registry lease lost; registering again", self.node.node)
                await self._reregister(period)
            except RegistryUnavailable as exc:
                log.warning("node %s: registry unreachable (%s); retrying", self.node.node, exc)

    async def _reregister(self, period: float) -> None:
        while True:
            try:
                await self._write_all()
            except (LeaseNotFound, RegistryUnavailable) as exc:
                log.warning("node %s: re-registration failed (%s); retrying", self.node.node, exc)
                await asyncio.sleep(min(period, 1.0))
                continue
            except Exception:  # a bug must not end the keep-alive: the node would vanish for good
                log.exception("node %s: re-registration failed; retrying", self.node.node)
                await asyncio.sleep(min(period, 1.0))
                continue
            self.reregistrations += 1
            log.info("node %s: registered again under lease %x", self.node.node, self.lease)
            return

    async def put(self, record: Record) -> None:
        """Add or replace one of the node's records (e.g. a memory engine's free bytes).

        It is kept for re-registration. ``ValueError`` if the record is another node's.
        """
        if getattr(record, "node", None) != self.node.node:
            raise ValueError(f"record {record.key()!r} does not belong to node {self.node.node!r}")
        key, value = record.key(), encode(record)
        self._records[key] = value
        if isinstance(record, NodeInfo):
            self.node = record
        await self.backend.put(key, value, lease=self.lease)

    async def forget(self, record: Record) -> None:
        """Delete one of the node's records (e.g. a link to a peer that left)."""
        self._records.pop(record.key(), None)
        await self.backend.delete(record.key())

    def _stop_task(self) -> asyncio.Task[None] | None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def abandon(self) -> None:
        """Stop refreshing without deleting anything: the records expire with the lease."""
        task = self._stop_task()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Deregister now: stop refreshing and revoke the lease. Never raises on a dead registry."""
        await self.abandon()
        with contextlib.suppress(RegistryUnavailable):
            await self.backend.revoke_lease(self.lease)
        self.registered.clear()

    async def __aenter__(self) -> NodeRegistration:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def register_node(backend: RegistryBackend, node: NodeInfo, *,
                        op_engines: Iterable[OpEngineInfo] = (),
                        memory_engines: Iterable[MemoryEngineInfo] = (),
                        network_engines: Iterable[NetworkEngineInfo] = (),
                        bindings: Iterable[Binding] = (),
                        ttl_s: float = 5.0) -> NodeRegistration:
    """Write ``node`` and its engines under a fresh lease and keep it alive.

    Every record must belong to ``node`` (``ValueError`` otherwise, before anything is
    written). Raises :class:`RegistryUnavailable` if the first registration cannot be
    written; after that, outages are retried in the background.
    """
    check_name(node.node, "node")
    records: list[Record] = [*op_engines, *memory_engines, *network_engines, *bindings]
    for r in records:
        if getattr(r, "node", None) != node.node:
            raise ValueError(f"record {r.key()!r} does not belong to node {node.node!r}")
    reg = NodeRegistration(backend, node, records, ttl_s)
    await reg._write_all()
    reg._task = asyncio.get_running_loop().create_task(reg._keep_alive(), name=f"registry-node-{node.node}")
    return reg


async def _list(backend: RegistryBackend, cls: type[R], prefix: str) -> list[R]:
    found: list[R] = []
    for entry in await backend.get_prefix(prefix):
        try:
            found.append(decode(cls, entry.value, key=entry.key))
        except RecordError as exc:
            log.warning("skipping registry entry: %s", exc)
    return found


def _under(kind_prefix: str, node: str | None) -> str:
    return kind_prefix if node is None else f"{kind_prefix}{check_name(node, 'node')}/"


async def list_nodes(backend: RegistryBackend) -> list[NodeInfo]:
    """Live nodes sorted by id; malformed entries are logged and skipped."""
    return await _list(backend, NodeInfo, NodeInfo.kind_prefix)


async def list_node_leases(backend: RegistryBackend) -> dict[str, tuple[float, float]]:
    """node -> ``(ttl_s, left_s)`` of the lease its ``nodes/<node>`` record lives on
    (:meth:`RegistryBackend.lease_ttl`); a node whose lease is gone meanwhile, or whose
    record has none, is left out."""
    entries = [e for e in await backend.get_prefix(NodeInfo.kind_prefix) if e.lease]
    found = await asyncio.gather(*(backend.lease_ttl(e.lease) for e in entries))
    return {e.key.removeprefix(NodeInfo.kind_prefix): f for e, f in zip(entries, found, strict=True)
            if f is not None}


STATS_PREFIX = "stats/"  # stats/<node>: an executor's counters, JSON (executor/daemon.py)


async def list_node_stats(backend: RegistryBackend) -> dict[str, dict[str, Any]]:
    """node -> the counters its executor last published under ``stats/<node>``; a record
    that is not a JSON object is logged and skipped."""
    out: dict[str, dict[str, Any]] = {}
    for entry in await backend.get_prefix(STATS_PREFIX):
        try:
            value = json.loads(entry.value)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            log.warning("skipping registry entry %s: not a JSON object", entry.key)
            continue
        out[entry.key.removeprefix(STATS_PREFIX)] = value
    return out


async def list_op_engines(backend: RegistryBackend, node: str | None = None) -> list[OpEngineInfo]:
    """Op engines of every node (or of ``node``)."""
    return await _list(backend, OpEngineInfo, _under(OpEngineInfo.kind_prefix, node))


async def list_memory_engines(backend: RegistryBackend, node: str | None = None) -> list[MemoryEngineInfo]:
    """Memory engines of every node (or of ``node``)."""
    return await _list(backend, MemoryEngineInfo, _under(MemoryEngineInfo.kind_prefix, node))


async def list_links(backend: RegistryBackend, node: str | None = None) -> list[LinkInfo]:
    """Measured pairs of every node (or those ``node`` measured), sorted by key."""
    return await _list(backend, LinkInfo, _under(LinkInfo.kind_prefix, node))


async def list_network_engines(backend: RegistryBackend, node: str | None = None) -> list[NetworkEngineInfo]:
    """Network engines of every node (or of ``node``)."""
    return await _list(backend, NetworkEngineInfo, _under(NetworkEngineInfo.kind_prefix, node))


async def list_bindings(backend: RegistryBackend, node: str | None = None) -> list[Binding]:
    """Compute-storage bindings of every node (or of ``node``)."""
    return await _list(backend, Binding, _under(Binding.kind_prefix, node))


@dataclass(frozen=True)
class NodeEvent:
    """A node came up (or changed its record) or went down."""

    kind: Literal["up", "down"]
    node: str
    info: NodeInfo | None


async def watch_nodes(backend: RegistryBackend, *, retry_s: float = 0.5) -> AsyncIterator[NodeEvent]:
    """Every node as ``up`` first (the current list), then each change, forever.

    List-then-watch with the watch opened first, so no change is lost between the two.
    If the backend loses the watch (:class:`RegistryUnavailable`), it re-lists when the
    registry is back and yields the difference, so consumers always converge. Malformed
    node values are skipped with a warning. Stop by breaking out or cancelling.
    """
    known: dict[str, NodeInfo] = {}
    while True:
        try:
            async with backend.watch_prefix(NodeInfo.kind_prefix) as events:
                current = {n.node: n for n in await list_nodes(backend)}
                for name in sorted(set(known) - set(current)):
                    del known[name]
                    yield NodeEvent("down", name, None)
                for name, info in current.items():
                    if known.get(name) != info:
                        known[name] = info
                        yield NodeEvent("up", name, info)
                async for ev in events:
                    name = ev.key[len(NodeInfo.kind_prefix):]
                    if ev.kind == "delete":
                        if known.pop(name, None) is not None:
                            yield NodeEvent("down", name, None)
                        continue
                    try:
                        info = decode(NodeInfo, ev.value, key=ev.key)
                    except RecordError as exc:
                        log.warning("skipping registry entry: %s", exc)
                        continue
                    if known.get(name) != info:
                        known[name] = info
                        yield NodeEvent("up", name, info)
        except RegistryUnavailable as exc:
            log.warning("node watch lost (%s); re-listing in %.1f s", exc, retry_s)
            await asyncio.sleep(retry_s)


async def list_drained(backend: RegistryBackend) -> list[Drained]:
    """The drained nodes (``Drained`` records), sorted by node."""
    return await _list(backend, Drained, Drained.kind_prefix)


async def set_drained(backend: RegistryBackend, node: str, drained: bool, *, by: str = "admin") -> bool:
    """Drain ``node`` (write its ``Drained`` record) or undrain it (delete it); whether
    that changed anything."""
    key = Drained(node, 0.0, by).key()
    if not drained:
        return await backend.delete(key)
    if await backend.get(key) is not None:
        return False
    await backend.put(key, encode(Drained(node, time.time(), by)))
    return True
