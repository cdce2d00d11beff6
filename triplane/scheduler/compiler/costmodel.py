"""The cost model: predicted compute and transfer times of tasks on cluster nodes.

A *task* is one non-``input`` node of a graph (a whole-tensor graph or the tiler's tile
graph alike: the model never asks which). Its work comes from the op table
(``OpDef.cost`` -> FLOPs and bytes moved); a node's speed comes from what its engines
reported to the registry (matmul GFLOP/s and elementwise GB/s of its op engine, bandwidth
and latency of its network engine), condensed into :class:`NodeFigures` by the cluster view
(``scheduler/cluster.py``): the compiler is given figures and reads no registry.

Predictions (seconds):

* compute:  ``max(flops / gflops, bytes / gbps) * scale(op) + task_overhead_s`` — the
  roofline: a matmul is bound by FLOP/s, an elementwise op by memory bandwidth, and the
  overhead is the dispatch round trip a task pays however small it is. An *inline* op
  (``INLINE_OPS``: the ops the table declares ``view``: ``slice``, ``transpose``,
  ``broadcast_to``, whose kernels return a view of their input) costs the overhead only,
  and placement does not make it wait for, or hold, one of the node's slots: the
  executor runs it at once on its event loop, beside a running kernel (docs/executor.md).
* transfer: ``bytes / bandwidth + latency`` of the pair when either end measured it (the
  registry's per-pair ``links``, the worse of both directions), else ``bytes / min(bandwidth
  of both ends) + max(latency of both ends)``; zero
  when the data is already on the node. A source that is not a compute node (the
  scheduler's data server holding uploaded tensors) is represented by the destination's
  own figures.

Nothing here models contention (two transfers sharing a link, two kernels sharing
memory bandwidth): placement serialises tasks per slot and pulls per task, which is
where most of the contention lives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from triplane.proto import opdef, optable
from triplane.proto.errors import UnknownOpError
from triplane.proto.ir import Graph, Node, TensorType

__all__ = [
    "CostModel",
    "NodeFigures",
    "SCHEDULER",
    "TaskCost",
    "format_bytes",
    "format_seconds",
    "parse_bytes",
    "parse_rate",
    "task_cost",
]

SCHEDULER = "scheduler"
"""The location of uploaded tensors (``input`` nodes): the scheduler's data server."""


@dataclass(frozen=True)
class NodeFigures:
    """What placement needs to know about one executor node.

    ``ops`` / ``dtypes`` None mean "every op" / "every dtype" (tests, simple clusters).
    ``gflops`` is the op engine's measured matmul rate, ``gbps`` its elementwise memory
    rate (GB/s, 1e9 bytes); ``memory_capacity`` / ``memory_free`` are bytes of its memory
    engine(s); ``bandwidth_gbps`` (GB/s) and ``latency_us`` describe its network engine;
    ``slots`` is how many tasks it runs at once. ``links`` are its measured pairs:
    ``(peer, bandwidth_gbps, latency_us)`` each (the registry's ``links/<node>/<peer>``).
    """

    name: str
    gflops: float
    gbps: float
    memory_capacity: int
    memory_free: int | None = None
    bandwidth_gbps: float = 1.0
    latency_us: float = 100.0
    ops: frozenset[str] | None = None
    dtypes: frozenset[str] | None = None
    slots: int = 1
    links: tuple[tuple[str, float, float], ...] = ()

    def __post_init__(self) -> None:
        for what in ("gflops", "gbps", "bandwidth_gbps"):
            v = getattr(self, what)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"node {self.name!r}: {what} must be a positive number, got {v!r}")
        if self.latency_us < 0 or self.memory_capacity < 0 or self.slots < 1:
            raise ValueError(f"node {self.name!r}: latency and memory must be >= 0 and slots >= 1")
        if self.memory_free is None:
            object.__setattr__(self, "memory_free", self.memory_capacity)
        object.__setattr__(self, "_links", {p: (bw, lat) for p, bw, lat in self.links if bw > 0})

    def link(self, peer: str) -> tuple[float, float] | None:
        """``(bandwidth_gbps, latency_us)`` measured from this node to ``peer``, or None."""
        return self._links.get(peer)  # type: ignore[attr-defined,no-any-return]

    @property
    def free(self) -> int:
        """Bytes placement may fill on this node."""
        return int(self.memory_free if self.memory_free is not None else self.memory_capacity)

    def supports_op(self, op: str) -> bool:
        return self.ops is None or op in self.ops

    def supports_dtype(self, dtype: str) -> bool:
        return self.dtypes is None or dtype in self.dtypes


@dataclass(frozen=True)
class TaskCost:
    """A task's work: FLOPs, bytes read + written, and its output's size in bytes."""

    flops: float
    bytes: float
    out_bytes: int


def task_cost(graph: Graph, task: str) -> TaskCost:
    """The op table's cost of node ``task`` of ``graph``. An op the table does not know
    (a user op registered only on the executors) counts one FLOP and one read/write per
    element, as the table's default does."""
    node = graph.nodes[task]
    ins = [graph.nodes[i].type for i in node.inputs]
    out = node.type
    try:
        c = optable.get(node.op).cost(ins, out, node.attrs)
    except UnknownOpError:
        c = opdef.default_cost(ins, out, node.attrs)
    return TaskCost(float(c.flops), float(c.bytes), out.nbytes)


# Ops whose kernels run far below the engine's measured rates: the counter-based random
# numbers are integer mixing and float64 transcendentals per element (numpy here, 4096^2
# float32: normal 0.7-0.88 s, uniform 0.19 s, against roofline times of 7.4 and 5.5 ms).
DEFAULT_OP_SCALE: Mapping[str, float] = {"normal": 100.0, "uniform": 35.0}

# Ops whose kernels return a view of their input: O(1) however big the tile. The executor
# runs them inline, not behind a running kernel. Declared on the op (``OpDef.view``).
INLINE_OPS: frozenset[str] = frozenset(name for name, op in optable.table().items() if op.view)


@dataclass(frozen=True)
class CostModel:
    """Turns work into seconds on a node. ``op_scale`` multiplies the roofline time of
    named ops (calibration: an op whose kernel runs at a fraction of the engine's
    measured rates, such as counter-based random generation: ``DEFAULT_OP_SCALE``)."""

    task_overhead_s: float = 200e-6
    op_scale: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_OP_SCALE))
    inline_ops: frozenset[str] = INLINE_OPS

    def compute_time(self, cost: TaskCost, node: NodeFigures, op: str = "") -> float:
        """Predicted seconds of one task's kernel on ``node`` (with the task overhead)."""
        if op in self.inline_ops:
            return self.task_overhead_s
        t = max(cost.flops / (node.gflops * 1e9), cost.bytes / (node.gbps * 1e9))
        return t * self.op_scale.get(op, 1.0) + self.task_overhead_s

    def inline(self, op: str) -> bool:
        """Whether a task of ``op`` runs at once on its node, beside the running kernels."""
        return op in self.inline_ops

    def transfer_time(self, nbytes: float, src: NodeFigures | None, dst: NodeFigures) -> float:
        """Predicted seconds to move ``nbytes`` from ``src`` (None: a non-compute holder such
        as the scheduler's data server) to ``dst``. Same node: zero."""
        if src is not None and src.name == dst.name:
            return 0.0
        if src is not None and (src.links or dst.links):
            pair = [f for f in (src.link(dst.name), dst.link(src.name)) if f is not None]
            if pair:  # the pair as measured (either direction; the worse if both)
                bw, lat = min(f[0] for f in pair), max(f[1] for f in pair)
                return nbytes / (bw * 1e9) + lat * 1e-6
        bw = dst.bandwidth_gbps if src is None else min(src.bandwidth_gbps, dst.bandwidth_gbps)
        lat = dst.latency_us if src is None else max(src.latency_us, dst.latency_us)
        return nbytes / (bw * 1e9) + lat * 1e-6

    def node_compute_time(self, graph: Graph, task: str, node: NodeFigures) -> float:
        return self.compute_time(task_cost(graph, task), node, graph.nodes[task].op)


def is_task(node: Node) -> bool:
    """Whether a graph node is a task (everything but uploaded ``input`` data)."""
    return node.op != "input"


def type_text(t: TensorType) -> str:
    return f"{t.dtype.name}{list(t.shape)}"


# --- units ---------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """``"768MiB"`` -> 805306368; ``"1GB"`` -> 10**9; a bare number is bytes."""
    if isinstance(text, int):
        return text
    s = text.strip().lower().replace(" ", "")
    i = len(s)
    while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    num, unit = s[:i], s[i:]
    if not num or unit not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 768MiB, 2GB, 1048576; "
                         f"units: {', '.join(u for u in _UNITS if u)})")
    return int(float(num) * _UNITS[unit])


def parse_rate(text: str | float) -> float:
    """A bandwidth in GB/s (1e9 bytes/s): ``"1GB/s"`` -> 1.0, ``"100MB/s"`` -> 0.1,
    ``"10Gbit/s"`` -> 1.25; a bare number is GB/s."""
    if isinstance(text, (int, float)):
        return float(text)
    s = text.strip().replace(" ", "")
    if s.lower().endswith("/s"):
        s = s[:-2]
    try:
        return float(s)
    except ValueError:
        pass
    bits = s.lower().endswith("bit")
    if bits:
        s = s[:-3] + "B"
    return parse_bytes(s) / 1e9 / (8 if bits else 1)


def format_bytes(n: float) -> str:
    """``805306368`` -> ``"768 MiB"`` (binary units, as memory is sold)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"


def format_seconds(s: float) -> str:
    """``0.0123`` -> ``"12.3 ms"``."""
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"
