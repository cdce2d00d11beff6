"""The executor daemon: one node of the compute plane (docs/runtime.md, "Task execution").

``Executor.start()`` measures its engines (a short benchmark), starts the data port, the
packet server and its network engines (serving the pair probe), and registers the node
with its engines under a lease (``triplane.registry.register_node``); then it measures
its link to each peer and publishes ``links/<node>/<peer>`` (``executor/links.py``).
While it runs it refreshes the memory engine's free bytes and publishes its counters
under ``stats/<node>`` (same lease) when they change.
``stop()`` deregisters at once (revokes the lease) and closes every socket; a process
killed without ``stop()`` vanishes from the registry when its lease expires.

Peers are found through the registry: ``nodes/<node>`` for executors, ``scheduler/data``
(``{"address", "data_port"}``) for node ``scheduler``; looked-up addresses are cached for
a couple of seconds and looked up again when a pull fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from triplane._version import __version__
from triplane.engines.errors import MissingTileError
from triplane.engines.memory.persist import PERSIST_ENV, STORE_PREFIX, persist_targets
from triplane.engines.network.measure import probe_handler
from triplane.engines.network.wrappers import Delayed
from triplane.executor.dataport import EngineTiles
from triplane.executor.intake import Intake
from triplane.executor.links import LinkProber
from triplane.executor.plugins import make_memory_engine, make_network_engines, make_op_engines
from triplane.executor.server import PacketServer
from triplane.executor.tasks import TaskRunner
from triplane.net.dataport import DataClient, DataPortError, DataServer
from triplane.net.guard import DEFAULT_LIMITS, Limits
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import KernelError
from triplane.registry import (
    Binding,
    MemoryEngineInfo,
    NetworkEngineInfo,
    NodeInfo,
    NodeRegistration,
    OpEngineInfo,
    RegistryBackend,
    RegistryError,
    list_nodes,
    register_node,
)

__all__ = ["SCHEDULER_DATA_KEY", "Executor", "default_node_name"]

log = logging.getLogger(__name__)

SCHEDULER_DATA_KEY = "scheduler/data"
_PEER_TTL_S = 2.0
CLOCK_SKEW_S = 1.0


def usable_cpus() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_node_name() -> str:
    """``<host>-<pid>``, restricted to characters valid in packet ids and registry keys."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:40] or "node"
    return f"{host}-{os.getpid()}"


class _Engines:
    """Several op engines as one: an op runs on the first engine that supports it."""

    def __init__(self, engines: Sequence[Any]) -> None:
        self.engines = list(engines)
        self.name = "+".join(e.name for e in self.engines)

    def supports(self, op: str, dtypes: Sequence[str] = ()) -> bool:
        return any(e.supports(op, dtypes) for e in self.engines)

    def run(self, op: str, inputs: Sequence[np.ndarray], attrs: Any, out: Any) -> np.ndarray:
        dtypes = [dt.dtype(a.dtype).name for a in inputs]
        engine = next((e for e in self.engines if e.supports(op, dtypes)), None)
        if engine is None:  # e.g. the plugin that ran it was isolated since (executor/plugins.py)
            raise KernelError(f"no engine of this node runs {op} on {dtypes}", op=op, kind="infra")
        return engine.run(op, inputs, attrs, out)


class Executor:
    """One executor node. Use ``await start()``, then ``await stop()`` (or ``async with``)."""

    def __init__(self, registry: RegistryBackend, secret: bytes, *, memory_bytes: int,
                 engines: Sequence[str] = ("numpy",), memory_engine: str = "host",
                 memory_options: dict[str, Any] | None = None, persist: str | None = None,
                 host: str = "127.0.0.1", advertise: str | None = None,
                 packet_port: int = 0, data_port: int = 0,
                 name: str | None = None,
                 drop_udp: float = 0.0, fault_seed: int = 0, workers: int = 1, ttl_s: float = 5.0,
                 stats_interval_s: float = 1.0, benchmark_size: int = 512,
                 limits: Limits = DEFAULT_LIMITS, network_engines: Sequence[str] = ("tcp", "udp"),
                 network_delay_ms: float = 0.0, link_interval_s: float = 5.0) -> None:
        self.registry = registry
        self.secret = secret
        self.name = name or default_node_name()
        self.host = host  # where the servers listen (0.0.0.0: every interface)
        self.address = advertise or host  # what peers and the scheduler are told (registry)
        self.ttl_s = ttl_s
        self.stats_interval_s = stats_interval_s
        self.benchmark_size = benchmark_size
        if not engines:
            raise ValueError("at least one op engine is needed")
        # Plugins are isolated (executor/plugins.py): a bad one is left out, its problem kept here.
        self.plugin_problems: list[Any] = []
        self.op_engines = make_op_engines(engines, self.plugin_problems)
        # Tiles live in the memory engine named (built-in ``host``, or a plugin): the executor
        # uses only what the MemoryEngine protocol names.
        self.store = make_memory_engine(memory_engine, memory_bytes, self.plugin_problems, memory_options)
        self.client = DataClient(secret)
        # Persistence targets (file:DIR, redis://...): where a persisted job's tiles are kept too.
        persisted = persist_targets(persist if persist is not None else os.environ.get(PERSIST_ENV))
        self.data = DataServer(EngineTiles(self.store, persisted), secret, host=host, port=data_port,
                               limits=limits)
        self.intake = Intake(secret, self.name)
        # One engine (the usual case) is used as it is: the wrapper would ask it twice per task
        # whether it supports the op.
        engine = self.op_engines[0] if len(self.op_engines) == 1 else _Engines(self.op_engines)
        self.runner = TaskRunner(engine, self.store, self._pull, node=self.name, workers=workers)
        self.runner.persist = persisted
        self.packets = PacketServer(self.intake, self.runner, host=host, port=packet_port, drop_udp=drop_udp,
                                    fault_seed=fault_seed, limits=limits)
        self.registration: NodeRegistration | None = None
        # Network engines serve the pair probe; the first (``--network-engine``) measures this
        # node's links (executor/links.py); a plugin that cannot be made is isolated and the
        # next one measures. A delay (tests: a slowed peer) wraps each of them.
        self.network = make_network_engines(network_engines, self.plugin_problems)
        if network_delay_ms > 0:
            self.network = [Delayed(e, delay_s=network_delay_ms / 1e3) for e in self.network]
        self.links = (LinkProber(self.name, self.network[0], registry, lambda: self.registration,
                                 interval_s=link_interval_s) if self.network else None)
        self._links_task: asyncio.Task[None] | None = None
        self.started_at = 0.0
        self._peers: dict[str, tuple[str, int, float]] = {}
        self._background: asyncio.Task[None] | None = None
        self._published: tuple[int, str] = (-1, "")
        self._withdrawn: set[str] = set()  # op engines isolated while serving, their ops withdrawn

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Benchmark, listen, register. Raises ``RegistryUnavailable`` if the registry cannot
        be reached (after closing what it opened)."""
        self.started_at = time.time()
        # Tasks sent before this start are refused: the replay memory begins now. The margin
        # absorbs clock skew (the scheduler cannot send before it sees us registered).
        self.intake.not_before = self.started_at - CLOCK_SKEW_S
        figures = [self._benchmark(e) for e in self.op_engines]
        await self.data.start()
        try:
            await self.packets.start()
            net = await self._measure_network()
            ports = [await e.serve(self.host, probe_handler) for e in self.network]
            self.registration = await register_node(
                self.registry, self._node_info(),
                op_engines=[self._op_info(e, f) for e, f in zip(self.op_engines, figures)],
                memory_engines=[self._memory_info()],
                network_engines=[NetworkEngineInfo(self.name, e.name, e.protocol, *net, port)
                                 for e, port in zip(self.network, ports)],
                bindings=[Binding(self.name, e.name, self.store.name) for e in self.op_engines],
                ttl_s=self.ttl_s)
        except BaseException:
            for e in self.network:
                await e.close()
            await self.packets.close()
            await self.data.close()
            raise
        self._background = asyncio.get_running_loop().create_task(self._publish_loop(), name="executor-stats")
        if self.links is not None:
            self._links_task = asyncio.get_running_loop().create_task(self.links.run(), name="executor-links")
        log.info("executor %s ready: packets udp+tcp %s:%d, data port %d, memory %d bytes, engines %s",
                 self.name, self.address, self.packets.port, self.data.port, self.store.capacity(),
                 [e.name for e in self.op_engines])

    async def stop(self) -> None:
        """Deregister now (revoke the lease), then close the servers. Never raises."""
        for task in (self._background, self._links_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.registration is not None:
            with contextlib.suppress(Exception):
                await self.registration.close()
        for e in self.network:
            await e.close()
        await self.packets.close()
        await self.data.close()
        await self.client.close()
        self.runner.close()
        log.info("executor %s stopped: %s", self.name, json.dumps(self.stats()["drops"]))

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def stats(self) -> dict[str, Any]:
        """Counters: packet drops by reason, tasks, data-port requests, memory, the upload
        cache (the scheduler reads ``cache.evictions``, ``refused``, ``dropped`` and the
        ``lost`` keys to forget what this node no longer keeps), the plugins isolated
        (``plugins``: kind, name, message), the tiles and bytes written to persistence
        targets (``persist``) and a spilling store's counters (``spill``)."""
        store, runs = self.store, self.runner.stats
        return {"node": self.name, **self.packets.stats(), "data_port": self.data.all_stats(),
                "memory": {"capacity": store.capacity(), "used": store.used(), "tiles": len(store),
                           "cached": store.cached(), "free": store.free()},
                "cache": {"entries": len(store.cache_keys()), "bytes": store.cached(),
                          "hits": runs["upload_hits"], "pulls": runs["upload_pulls"], **store.cache_report()},
                "plugins": [p.as_dict() for p in self.plugin_problems],
                "persist": {"tiles": runs.get("persisted", 0), "bytes": runs.get("persisted_bytes", 0)},
                **({"spill": store.spill_report()} if hasattr(store, "spill_report") else {})}

    # --- registry records ------------------------------------------------------------------

    def _node_info(self) -> NodeInfo:
        return NodeInfo(self.name, self.address, self.packets.port, self.packets.port, self.data.port,
                        __version__, self.started_at, os.getpid(), usable_cpus())

    def _memory_info(self) -> MemoryEngineInfo:
        # free() counts cache entries not in use as free: they are evicted for any tile
        # that needs the room, so placement may plan with those bytes.
        return MemoryEngineInfo(self.name, self.store.name, self.store.kind, self.store.capacity(),
                                self.store.free())

    def _benchmark(self, engine: Any) -> dict[str, float]:
        try:
            return dict(engine.benchmark(size=self.benchmark_size))
        except TypeError:  # an engine whose benchmark takes no size
            return dict(engine.benchmark())

    def _op_info(self, engine: Any, figures: dict[str, float]) -> OpEngineInfo:
        ops = tuple(op for op in optable.names() if engine.supports(op))
        declared = getattr(engine, "ops", None)  # a plugin listing {op: dtypes} declares its dtypes
        dtypes = (tuple(sorted(set().union(*declared.values()))) if isinstance(declared, dict)
                  else tuple(sorted(dt.BY_NAME)))
        return OpEngineInfo(self.name, engine.name, engine.name, getattr(engine, "device", "cpu"), ops,
                            dtypes, float(figures.get("matmul_gflops", 0.0)),
                            float(figures.get("elementwise_gbps", 0.0)))

    async def _measure_network(self) -> tuple[float, float]:
        """(GB/s, µs): a 4 MiB round trip and the best of a few small requests through our own
        data port -- loopback figures, a floor for what peers will see."""
        try:
            probe = np.zeros(1 << 20, dtype=np.float32)
            t = time.perf_counter()
            await self.client.put(self.address, self.data.port, "_probe", probe)
            await self.client.get(self.address, self.data.port, "_probe")
            gbps = 2 * probe.nbytes / max(time.perf_counter() - t, 1e-9) / 1e9
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                await self.client.stat(self.address, self.data.port, "_probe")
                best = min(best, time.perf_counter() - t)
            await self.client.delete(self.address, self.data.port, ["_probe"])
            return gbps, best * 1e6
        except DataPortError as e:
            log.warning("network self-measurement failed: %s", e)
            return 0.0, 0.0

    async def _publish_loop(self) -> None:
        """Refresh free bytes and ``stats/<node>`` when they change (cheap: one put each)."""
        while True:
            await asyncio.sleep(self.stats_interval_s)
            reg = self.registration
            if reg is None:
                continue
            try:
                free = self.store.free()
                stats = json.dumps(self.stats(), sort_keys=True, separators=(",", ":"))
                if free != self._published[0]:
                    await reg.put(self._memory_info())
                if stats != self._published[1]:
                    await self.registry.put(f"stats/{self.name}", stats.encode(), lease=reg.lease)
                self._published = (free, stats)
                for e in self.op_engines:  # a plugin isolated while serving: placement stops sending
                    if getattr(e, "reported", False) and e.name not in self._withdrawn:
                        await reg.put(self._op_info(e, {}))  # it supports nothing now: no ops
                        self._withdrawn.add(e.name)
            except RegistryError as e:  # lease being renewed or registry down: next round
                log.debug("stats publish failed: %s", e)
            if any(self.intake.counters.as_dict().values()):
                log.debug("packet drops: %s", self.intake.counters.as_dict())

    # --- pulling inputs ---------------------------------------------------------------------

    async def _read_persisted(self, node: str, tile: str) -> np.ndarray:
        target = self.runner.persist.get(node.removeprefix(STORE_PREFIX))
        if target is None:
            raise DataPortError(f"tile {tile} is kept by {node}, which this executor cannot read "
                                f"(its --persist-to: {sorted(self.runner.persist) or 'none'})")
        try:
            arr = await asyncio.to_thread(target.get, tile)
        except MissingTileError as e:
            raise DataPortError(f"tile {tile} is not in {node}: {e}", kind="missing") from None
        self.runner.stats["persisted_reads"] = self.runner.stats.get("persisted_reads", 0) + 1
        return arr

    async def _resolve(self, node: str, fresh: bool) -> tuple[str, int]:
        now = time.monotonic()
        hit = self._peers.get(node)
        if hit is not None and not fresh and now - hit[2] < _PEER_TTL_S:
            return hit[0], hit[1]
        if node == "scheduler":
            entry = await self.registry.get(SCHEDULER_DATA_KEY)
            if entry is None:
                raise DataPortError(f"the registry has no {SCHEDULER_DATA_KEY!r} (is a scheduler running?)")
            try:
                d = json.loads(entry.value)
                addr, port = str(d["address"]), int(d["data_port"])
            except (ValueError, KeyError, TypeError) as e:
                raise DataPortError(f"malformed {SCHEDULER_DATA_KEY!r} in the registry: {e}") from None
            self._peers[node] = (addr, port, now)
            return addr, port
        for info in await list_nodes(self.registry):
            self._peers[info.node] = (info.address, info.data_port, now)
        if node not in self._peers or self._peers[node][2] != now:
            self._peers.pop(node, None)
            raise DataPortError(f"node {node} is not in the registry (dead?)")
        return self._peers[node][0], self._peers[node][1]

    async def _pull(self, node: str, tile: str) -> np.ndarray:
        """``tile`` from ``node``'s data port; one retry with a fresh address if the first try
        fails for a reason other than the tile being absent. A holder ``store:<kind>`` is a
        persistence target: the tile is read there (its holder died)."""
        if node.startswith(STORE_PREFIX):
            return await self._read_persisted(node, tile)
        try:
            addr, port = await self._resolve(node, fresh=False)
            return await self.client.get(addr, port, tile)
        except DataPortError as e:
            if e.missing:
                raise
        except RegistryError as e:
            raise DataPortError(f"registry unavailable while resolving node {node}: {e}") from None
        addr, port = await self._resolve(node, fresh=True)
        return await self.client.get(addr, port, tile)
