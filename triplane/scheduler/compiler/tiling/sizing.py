"""Tile sizes from what the cluster reports.

:class:`ClusterFigures` condenses the registry (per node: memory capacity and free bytes,
op-engine GFLOP/s and GB/s; the network's bandwidth and latency) into the few numbers
the tiling pass needs; :func:`plan_sizes` turns them into :class:`TileSizes`:

* **memory (hard)**: a task's inputs plus its output must fit ``headroom`` of the
  smallest node's memory (default half: the rest holds tiles kept for other tasks), so
  ``max_task_bytes = headroom * min(free memory)``. A tensor larger than any one node is
  therefore always cut; a graph whose peak (the memory plan's, tensors freed after their
  last reader) exceeds the cluster's total memory is refused with a LimitError naming the
  tensor and the limit.
* **parallelism vs communication (soft)**: a fitting op is cut further (towards
  ``tasks_per_executor`` (2) tasks per executor) only while its predicted *span* on the
  cluster drops. The span of ``n`` tasks on ``E`` executors is ``max(1, n / E)`` waves
  of one task's time -- compute (the roofline ``max(flops / GFLOP/s, bytes / GB/s)`` of
  the slowest node) plus communication (``latency`` per input plus the bytes of every
  input but its largest over the bandwidth: placement runs a task where its largest
  input lives) plus the dispatch overhead -- plus, for a contraction split, the combine
  tree's tasks. So a 34 GFLOP matmul is split across two nodes even when its weight
  takes a quarter of a task's time to move (the whole op would move it too), and an
  elementwise op is not cut into more tasks than executors unless that moves fewer
  bytes. A task is also never cut below ``ratio`` (10) times its fixed costs (latency per
  input plus dispatch overhead): tiny tasks are dominated by them.
* **tiny graphs**: a graph whose tensors total at most ``unsplit_bytes`` is not cut at all.

``explicit`` fixes the cut of chosen nodes (tests; a user's hint): node id -> axis name ->
tile extent (an int; the last tile takes the remainder) or the interior boundaries (a
tuple). Axis names are the split rule's: ``d<i>`` for output dimension i, ``m``/``n``/``k``
for matmul, ``r<i>`` for a reduced input axis i (see docs/tiling.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triplane.scheduler.compiler.costmodel import DEFAULT_OP_SCALE, CostModel

__all__ = ["ClusterFigures", "NodeFigures", "TileSizes", "plan_sizes"]

MiB = 1 << 20


@dataclass(frozen=True)
class NodeFigures:
    """One executor node: memory bytes (capacity and free) of the engine its op engine
    computes on, and that op engine's measured matmul GFLOP/s and elementwise GB/s."""

    name: str
    memory_bytes: int
    gflops: float
    gbps: float
    free_bytes: int | None = None

    @property
    def usable_bytes(self) -> int:
        return self.memory_bytes if self.free_bytes is None else min(self.memory_bytes, self.free_bytes)


@dataclass(frozen=True)
class ClusterFigures:
    """The executors and the network between them (bandwidth GB/s, latency µs)."""

    nodes: tuple[NodeFigures, ...]
    bandwidth_gbps: float = 1.0
    latency_us: float = 200.0

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a cluster needs at least one executor node")

    @classmethod
    def uniform(cls, count: int, memory_bytes: int, *, gflops: float = 50.0, gbps: float = 10.0,
                bandwidth_gbps: float = 1.0, latency_us: float = 200.0) -> ClusterFigures:
        """``count`` identical nodes (tests, simple clusters)."""
        return cls(tuple(NodeFigures(f"n{i}", memory_bytes, gflops, gbps) for i in range(count)),
                   bandwidth_gbps, latency_us)

    @classmethod
    def from_nodes(cls, nodes: Iterable[Any]) -> ClusterFigures:
        """From placement's per-node figures (``triplane.scheduler.compiler.costmodel.
        NodeFigures``: name, gflops, gbps, memory_capacity, memory_free, bandwidth_gbps,
        latency_us); the network is the slowest link of any node."""
        ns = list(nodes)
        if not ns:
            raise ValueError("a cluster needs at least one executor node")
        return cls(tuple(NodeFigures(n.name, int(n.memory_capacity), float(n.gflops), float(n.gbps),
                                     getattr(n, "memory_free", None)) for n in ns),
                   min(float(n.bandwidth_gbps) for n in ns), max(float(n.latency_us) for n in ns))


@dataclass(frozen=True)
class TileSizes:
    """What the tiling pass obeys (see the module doc). The default cuts nothing and
    limits nothing, unless ``explicit`` asks."""

    max_task_bytes: int = 1 << 62
    total_bytes: int = 1 << 62
    min_tasks: int = 1
    unsplit_bytes: int = 0
    ratio: float = 10.0
    gflops: float = 50.0
    gbps: float = 10.0
    bandwidth_gbps: float = 1.0
    latency_s: float = 200e-6
    executors: int = 1
    # The cost model's dispatch round trip per task and calibration of slow ops (plan_sizes
    # copies both from the model placement uses).
    task_overhead_s: float = CostModel.task_overhead_s
    op_scale: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_OP_SCALE))
    explicit: Mapping[str, Mapping[str, int | Sequence[int]]] = field(default_factory=dict)
    # Input nodes whose value is already held in tiles (a tiled job's output bound as a
    # ref, scheduler/refs.py): node -> the boundaries of each dimension of those tiles.
    # Readers take their regions from those tiles (slice / concat) and align their cuts
    # with them, as with a tiled producer in the same graph.
    held: Mapping[str, Sequence[Sequence[int]]] = field(default_factory=dict)

    def compute_s(self, flops: float, nbytes: float) -> float:
        return max(flops / (self.gflops * 1e9), nbytes / (self.gbps * 1e9))

    def comm_s(self, in_bytes: Sequence[int]) -> float:
        if not in_bytes:
            return 0.0
        moved = sum(in_bytes) - max(in_bytes)
        return self.latency_s * len(in_bytes) + moved / (self.bandwidth_gbps * 1e9)

    def fixed_s(self, inputs: int) -> float:
        """A task's costs that do not shrink with its size: latency per input, dispatch."""
        return self.latency_s * inputs + self.task_overhead_s

    def span_s(self, tasks: int, task_s: float) -> float:
        """Predicted time of ``tasks`` equal tasks of ``task_s`` spread over the executors."""
        return task_s * max(1.0, tasks / max(1, self.executors))


def plan_sizes(figures: ClusterFigures, *, headroom: float = 0.5, ratio: float = 10.0,
               tasks_per_executor: int = 2, unsplit_bytes: int = 4 * MiB,
               explicit: Mapping[str, Mapping[str, int | Sequence[int]]] | None = None,
               model: CostModel | None = None) -> TileSizes:
    """Tile sizes for ``figures`` (see the module doc for each rule). ``model``: the cost
    model placement will use (default ``CostModel()``); tiling takes its task overhead and
    op calibration from it, so both predict a task's time alike."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    model = model or CostModel()
    usable = [n.usable_bytes for n in figures.nodes]
    return TileSizes(
        max_task_bytes=int(min(usable) * headroom),
        total_bytes=sum(usable),
        min_tasks=max(1, tasks_per_executor * len(figures.nodes)),
        unsplit_bytes=unsplit_bytes,
        ratio=ratio,
        gflops=min(n.gflops for n in figures.nodes),
        gbps=min(n.gbps for n in figures.nodes),
        bandwidth_gbps=figures.bandwidth_gbps,
        latency_s=figures.latency_us * 1e-6,
        executors=len(figures.nodes),
        task_overhead_s=model.task_overhead_s,
        op_scale=dict(model.op_scale),
        explicit=dict(explicit or {}),
    )


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"

