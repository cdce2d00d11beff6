"""The scheduler's view of the cluster: what the registry says exists, and what the
scheduler has learned about it since (how fast executors run now, which upload tiles they
keep cached).

* :func:`figures_from_registry` condenses the registry's node and engine records into the
  :class:`~triplane.scheduler.compiler.costmodel.NodeFigures` the compiler plans with;
  :meth:`ClusterView.snapshot` hands them to the compiler, calibrated and with the
  residency of uploads, as a :class:`~triplane.scheduler.compiler.compile.ClusterSnapshot`
  (the compiler itself reads no registry).
* the registry is read at most once per ``max_age_s`` (a burst of submits, a training
  loop, does not read it for each), and a submit checks its ops against the op engines
  read with those figures;
* ``nodes()`` / ``engines()`` are the bodies of ``GET /v1/nodes`` and ``GET /v1/engines``.
* drained nodes (``Drained`` records in the registry, so every scheduler replica reads
  the same) are left out of the figures placement plans with, and ``on_drained`` hands
  their set to the dispatcher, which places nothing new there (running tasks finish, a
  drifting task never goes there); :meth:`ClusterView.read_drained` re-reads them at
  once (a drain or undrain, taking the lead), else with the figures.

Errors: the registry's (``RegistryError``) propagate; nothing here raises otherwise.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

from triplane.registry import (
    OpEngineInfo,
    RegistryBackend,
    list_bindings,
    list_drained,
    list_links,
    list_node_leases,
    list_node_stats,
    list_nodes,
    list_op_engines,
)
from triplane.registry.records import LinkInfo, MemoryEngineInfo, NetworkEngineInfo
from triplane.scheduler.calibration import Calibration, bound_of
from triplane.scheduler.compiler.compile import ClusterSnapshot
from triplane.scheduler.compiler.costmodel import NodeFigures, task_cost
from triplane.scheduler.compiler.layout import MODEL, WHOLE_COMPUTE_S, Layout, same_host_figures
from triplane.scheduler.residency import Residency, read_evictions

__all__ = ["ClusterView", "Factors", "figures_from_records", "figures_from_registry", "read_plugin_problems"]

Factors = dict[str, tuple[float, float]]  # node -> (flops, bytes) calibration factors
_TASK_OVERHEAD_S = MODEL.task_overhead_s  # what placement adds to each kernel


def figures_from_records(op_engines: Iterable[OpEngineInfo],
                         memory_engines: Iterable[MemoryEngineInfo] = (),
                         network_engines: Iterable[NetworkEngineInfo] = (),
                         links: Iterable[LinkInfo] = (), *,
                         default_bandwidth_gbps: float = 1.0,
                         default_latency_us: float = 100.0) -> list[NodeFigures]:
    """One :class:`NodeFigures` per node that has an op engine, sorted by node name.

    A node with several engines of a kind: ops and dtypes are the union, speeds the best
    engine's, memory the sum of its memory engines, the network its fastest engine
    (lowest latency among them). A node without a network record gets the defaults;
    each op engine is one slot. ``links`` (per pair, measured by the first node) go to
    the node that measured them, for pairs between nodes listed here.
    """
    ops: dict[str, list[OpEngineInfo]] = {}
    for e in op_engines:
        ops.setdefault(e.node, []).append(e)
    mem: dict[str, list[MemoryEngineInfo]] = {}
    for m in memory_engines:
        mem.setdefault(m.node, []).append(m)
    net: dict[str, list[NetworkEngineInfo]] = {}
    for n in network_engines:
        net.setdefault(n.node, []).append(n)
    pairs: dict[str, list[tuple[str, float, float]]] = {}
    for link in links:
        if link.node in ops and link.peer in ops:
            pairs.setdefault(link.node, []).append((link.peer, link.bandwidth_gbps, link.latency_us))
    out = []
    for node in sorted(ops):
        engines = ops[node]
        mems = mem.get(node, [])
        nets = net.get(node, [])
        out.append(NodeFigures(
            name=node,
            gflops=max(e.gflops for e in engines),
            gbps=max(e.gbps for e in engines),
            memory_capacity=sum(m.capacity for m in mems),
            memory_free=sum(m.free for m in mems),
            bandwidth_gbps=max((n.bandwidth_gbps for n in nets), default=default_bandwidth_gbps),
            latency_us=min((n.latency_us for n in nets), default=default_latency_us),
            ops=frozenset(op for e in engines for op in e.ops),
            dtypes=frozenset(d for e in engines for d in e.dtypes),
            slots=len(engines),
            links=tuple(sorted(pairs.get(node, ()))),
        ))
    return out


async def figures_from_registry(backend: RegistryBackend) -> list[NodeFigures]:
    """:func:`figures_from_records` over what a registry backend holds now (live nodes)."""
    from triplane.registry.nodes import list_links, list_memory_engines, list_network_engines

    live = {n.node for n in await list_nodes(backend)}
    ops = [e for e in await list_op_engines(backend) if e.node in live]
    mems = await list_memory_engines(backend)
    nets = await list_network_engines(backend)
    return figures_from_records(ops, mems, nets, await list_links(backend))


class ClusterView:
    """The registry's executors as the scheduler sees them, plus what it learned about them
    (see the module doc). ``running(node)`` says how many tasks the dispatcher has there."""

    def __init__(self, registry: RegistryBackend, running: Any = None, *, max_age_s: float = 1.0) -> None:
        self.registry = registry
        self.running = running or (lambda node: 0)
        self.max_age_s = max_age_s
        self.residency = Residency()  # upload tiles cached on executors, for placement
        self.calibration = Calibration()  # how fast executors run now, from finished tasks
        self._figs: tuple[float, list[NodeFigures], list[OpEngineInfo]] = (0.0, [], [])
        self.drained: dict[str, tuple[float, str]] = {}  # node -> (drained at, by whom)
        self.on_drained: Any = lambda nodes: None  # the dispatcher's drained set follows this
        self.whole_s = WHOLE_COMPUTE_S  # a job under this on one node is not cut (--whole-s)

    async def read_drained(self) -> dict[str, tuple[float, str]]:
        """The drained nodes as the registry holds them now (also handed to ``on_drained``)."""
        drained = {d.node: (d.at, d.by) for d in await list_drained(self.registry)}
        if drained.keys() != self.drained.keys():
            self._figs = (0.0, *self._figs[1:])  # the next plan sees the change at once
        self.drained = drained
        self.on_drained(frozenset(drained))
        return drained

    async def figures(self) -> tuple[list[NodeFigures], list[OpEngineInfo]]:
        """The executors' figures (as registered, uncalibrated) and their op engines,
        read from the registry at most once per ``max_age_s``."""
        at, figs, engines = self._figs
        now = time.monotonic()
        if now - at > self.max_age_s or not figs:
            nodes = await list_nodes(self.registry)
            drained = await self.read_drained()
            hosts = {n.node: n.address for n in nodes}
            figs = same_host_figures(await figures_from_registry(self.registry), hosts,
                                     {n.node: n.cpus for n in nodes})
            figs = [f for f in figs if f.name not in drained]
            engines = await list_op_engines(self.registry)
            self._figs = (now, figs, engines)
            if len(self.residency):
                await read_evictions(self.registry, self.residency)
        return figs, engines

    async def snapshot(self) -> tuple[ClusterSnapshot, list[OpEngineInfo], Factors]:
        """What a compile is given (figures at the speed the executors run now, and where
        upload tiles are cached), the op engines a submit checks its ops against, and the
        calibration factors applied (a finished task's time is judged against them)."""
        figures, engines = await self.figures()
        factors = self.calibration.snapshot([f.name for f in figures])
        calibrated = self.calibration.apply(figures, factors)
        snap = ClusterSnapshot(tuple(calibrated), self.residency.lookup, whole_s=self.whole_s)
        return snap, engines, factors

    async def nodes(self) -> list[dict[str, Any]]:
        """``GET /v1/nodes``: the registered executors, their running tasks, calibration and
        memory (capacity and free bytes of their memory engines, as last published)."""
        from triplane.registry import list_memory_engines

        mem: dict[str, dict[str, int]] = {}
        for m in await list_memory_engines(self.registry):
            agg = mem.setdefault(m.node, {"capacity": 0, "free": 0})
            agg["capacity"] += m.capacity
            agg["free"] += m.free
        drained = await self.read_drained()
        links: dict[str, list[dict[str, Any]]] = {}
        for link in await list_links(self.registry):
            fields = ("peer", "engine", "bandwidth_gbps", "latency_us", "measured_at")
            links.setdefault(link.node, []).append({k: getattr(link, k) for k in fields})
        plugins = await read_plugin_problems(self.registry)
        leases = await list_node_leases(self.registry)
        return [
            {
                **_asdict(n),
                # measured pairs from this node (executor/links.py), for `triplane status`
                "links": links.get(n.node, []),
                # plugins it isolated (executor/plugins.py), from its stats/<node> record
                "plugins": plugins.get(n.node, []),
                **_lease_health(leases.get(n.node)),
                "running": self.running(n.node),
                "memory": mem.get(n.node, {"capacity": 0, "free": 0}),
                # how much slower than registered its kernels run now (calibration.py)
                "calibration": {b: self.calibration.factor(n.node, b) for b in ("flops", "bytes")},
                "drained": n.node in drained,
                "drained_at": drained[n.node][0] if n.node in drained else None,
            }
            for n in await list_nodes(self.registry)
        ]

    async def engines(self) -> list[dict[str, Any]]:
        """``GET /v1/engines``: the registered op engines by (node, engine), each with the
        memory engine it is bound to (its ``Binding``; None without one)."""
        bound = {(b.node, b.op_engine): b.memory_engine for b in await list_bindings(self.registry)}
        found = sorted(await list_op_engines(self.registry), key=lambda e: (e.node, e.engine))
        return [{**_asdict(e), "memory_engine": bound.get((e.node, e.engine))} for e in found]

    def node_down(self, node: str) -> None:
        """``node`` is gone: forget what it cached and how fast it ran."""
        self.residency.forget_node(node)
        self.calibration.forget(node)

    def ran(self, node: str, uploads: Sequence[str]) -> None:
        """A task that read ``uploads`` ran on ``node``: the executor keeps what it read."""
        if uploads:  # the job tiles refs bind are pulled for the task only, never cached
            self.residency.learn(node, [u for u in uploads if u.startswith("u-")])

    def calibrate(self, layout: Layout | None, factors: Factors, task: str, node: str,
                  kernel_s: float) -> None:
        """Teach the calibration what ``task``'s kernel took on ``node`` beside the
        prediction its job was placed with (``factors``: the calibration applied then)."""
        if layout is None or layout.placement is None:
            return
        tp = layout.placement.tasks.get(task)
        predicted = tp.compute_s - _TASK_OVERHEAD_S if tp is not None else 0.0
        if tp is None or tp.node != node or predicted < self.calibration.min_predicted_s:
            return
        fig = next((f for f in layout.figures if f.name == node), None)
        if fig is None:
            return
        bound = bound_of(task_cost(layout.graph, task), fig)
        ff, fb = factors.get(node, (1.0, 1.0))
        self.calibration.observe(node, bound, predicted, kernel_s, ff if bound == "flops" else fb)


def _lease_health(lease: tuple[float, float] | None) -> dict[str, Any]:
    """``health`` and ``lease`` of a node from its registry lease: ``up`` while the lease was
    refreshed within two thirds of its TTL (its keep-alive refreshes every third; etcd counts
    whole seconds), ``late`` past that (two refreshes missed: the node expires at ``left_s``
    unless one lands), ``unknown`` when the lease could not be read (gone between the reads)."""
    if lease is None:
        return {"health": "unknown", "lease": None}
    ttl, left = lease
    age = max(0.0, ttl - left)
    return {"health": "up" if age <= ttl * 2 / 3 else "late",
            "lease": {"ttl_s": ttl, "left_s": left, "age_s": age}}


def _asdict(record: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(record).items()}


async def read_plugin_problems(registry: RegistryBackend) -> dict[str, list[dict[str, str]]]:
    """node -> the plugins it isolated (``plugins`` of its ``stats/<node>`` record, read by
    ``registry.list_node_stats``: kind, name, message). A record whose ``plugins`` is not a
    list of objects is skipped: one bad record does not hide the others'."""
    found: dict[str, list[dict[str, str]]] = {}
    for node, stats in (await list_node_stats(registry)).items():
        try:
            listed = stats.get("plugins") or []
            found[node] = [{k: str(p.get(k, "")) for k in ("kind", "name", "message")} for p in listed]
        except (AttributeError, TypeError):
            continue
    return found
