"""Cost-based placement: which node runs each task, and when, to finish soonest.

Any graph is a task graph here: every non-``input`` node is one task (a whole-tensor
plan or the tiler's tile graph alike). :func:`place` is list scheduling in the manner
of HEFT: tasks are taken in decreasing *upward rank* (the predicted length of the
longest path from the task to the end, with mean compute and transfer times) among
those whose inputs are placed, and each goes to the node where it is predicted to
*finish* earliest, given when that node has a free slot, when its inputs can be pulled
there (one pull after another on the node's link) and when its memory has room.

The framework is a few narrow extension points, after the Kubernetes scheduler's --
filters, scores and binders returning a coded :class:`Status` -- defined with the
built-in plugins in ``placement_plugins.py`` (re-exported here). If every node is
filtered out, placement fails with :class:`PlacementError` whose status says why for the
whole cluster (``no engine supports conv2d on bfloat16``; ``needs 900 MiB ..., the
largest free memory is 768 MiB on n2``).

Memory is tracked as intervals per node: a tensor's copy occupies its node from when it
is made (a task's start, or a pull's start) until the last reader there has finished
and the last pull from there has arrived; until all readers of a tensor are placed its
end is unknown (open). Graph outputs stay to the end (they are fetched). A filter sees
the bytes still live at the candidate's start, counting open intervals, so it is
conservative. ``Placement.peak_memory`` is the exact peak of the final intervals.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph, Node, TensorType
from triplane.scheduler.compiler.costmodel import (
    SCHEDULER,
    CostModel,
    NodeFigures,
    TaskCost,
    task_cost,
    type_text,
)
from triplane.scheduler.compiler.placement_plugins import (
    SUCCESS,
    Binder,
    BindPlugin,
    Code,
    EngineSpeed,
    FilterPlugin,
    FitsMemory,
    Framework,
    LeastLoaded,
    LocalBytes,
    ScorePlugin,
    Status,
    SupportsOp,
)

__all__ = [
    "Binder", "BindPlugin", "Code", "EngineSpeed", "Estimate", "FilterPlugin", "FitsMemory",
    "Framework", "LeastLoaded", "LocalBytes", "Placement", "PlacementError", "PlacementState",
    "Pull", "ScorePlugin", "Status", "SupportsOp", "TaskPlacement", "TaskView", "place", "task_view",
    "task_views", "upward_ranks",
]


class PlacementError(GraphError):
    """No node can run a task (or a plugin failed). ``status`` is the coded cause; the
    message names the task, its op and the limit that stopped it."""

    kind = "placement"

    def __init__(self, status: Status, *, node: str | None = None, op: str | None = None,
                 what: str = "") -> None:
        self.status = status
        self.what = what or (f"task {node!r} ({op})" if node else "")
        super().__init__(status.reason, node=node, op=op)

    def _compose(self) -> str:
        return f"cannot place {self.what}: {self.reason}" if self.what else f"cannot place: {self.reason}"


# --- what plugins see ------------------------------------------------------------------


@dataclass(frozen=True)
class TaskView:
    """One task: its node of the graph, distinct inputs, output type and work."""

    id: str
    node: Node
    inputs: tuple[str, ...]
    in_bytes: Mapping[str, int]
    out: TensorType
    cost: TaskCost
    in_dtypes: tuple[str, ...] = ()

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def dtypes(self) -> frozenset[str]:
        """Every dtype the task reads or writes."""
        return frozenset({self.out.dtype.name, *self.in_dtypes})

    @property
    def working_set(self) -> int:
        """Bytes that must be in the node's memory while it runs: inputs and output."""
        return sum(self.in_bytes.values()) + self.out.nbytes

    def describe(self) -> str:
        return f"task {self.id!r} ({self.op} -> {type_text(self.out)})"


@dataclass(frozen=True)
class Pull:
    """An input a task pulls from another holder before it runs."""

    tensor: str
    source: str
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Estimate:
    """Predicted timing of one task on one node."""

    node: str
    dispatch: float  # when its last input is ready somewhere (and memory has room)
    start: float
    finish: float
    compute_s: float
    comm_s: float
    pulls: tuple[Pull, ...]
    new_bytes: int  # memory the task adds on the node: pulled copies and its output


class _Interval:
    __slots__ = ("bytes", "end", "start", "tensor")

    def __init__(self, tensor: str, nbytes: int, start: float) -> None:
        self.tensor, self.bytes, self.start, self.end = tensor, nbytes, start, math.inf


@dataclass
class _NodeMemory:
    intervals: list[_Interval] = field(default_factory=list)
    open_bytes: int = 0
    ends: list[float] = field(default_factory=list)  # finite interval ends, sorted
    end_bytes: list[int] = field(default_factory=list)  # bytes of each, same order

    def live_at(self, t: float) -> int:
        i = bisect.bisect_right(self.ends, t)
        return self.open_bytes + sum(self.end_bytes[i:])

    def earliest_fit(self, need: int, cap: int, t: float) -> float | None:
        """The first time >= t at which ``need`` more bytes fit under ``cap``."""
        i = bisect.bisect_right(self.ends, t)
        live = self.open_bytes + sum(self.end_bytes[i:])
        while live + need > cap:
            if i >= len(self.ends):
                return None
            t = self.ends[i]
            # every interval ending at exactly t is free from t on
            while i < len(self.ends) and self.ends[i] <= t:
                live -= self.end_bytes[i]
                i += 1
        return t

    def close(self, iv: _Interval, end: float) -> None:
        iv.end = end
        self.open_bytes -= iv.bytes
        k = bisect.bisect_right(self.ends, end)
        self.ends.insert(k, end)
        self.end_bytes.insert(k, iv.bytes)


class PlacementState:
    """Everything decided so far; plugins read it, binders write it through :meth:`commit`."""

    def __init__(self, graph: Graph, nodes: Sequence[NodeFigures], model: CostModel,
                 locations: Mapping[str, str], cached: Mapping[str, Sequence[str]] | None = None) -> None:
        self.graph = graph
        self.model = model
        self.figures = {n.name: n for n in nodes}
        # With per-pair figures, each node's best way out (its fastest pair, its shortest
        # latency to another node) for the look ahead of _egress; empty without pairs.
        self.egress: dict[str, tuple[float, float]] = {}
        if any(n.links for n in nodes) and len(nodes) > 1:
            for n in nodes:
                peers = [m for m in nodes if m is not n]
                lats = [model.transfer_time(0.0, n, m) for m in peers]
                outs = [model.transfer_time(1.0, n, m) - lat for m, lat in zip(peers, lats)]
                self.egress[n.name] = (min(outs), min(lats))
        self._egress_of: dict[str, dict[str, float]] = {}
        self.slots: dict[str, list[float]] = {n.name: [0.0] * n.slots for n in nodes}
        self.busy: dict[str, float] = {n.name: 0.0 for n in nodes}
        self.memory: dict[str, _NodeMemory] = {n.name: _NodeMemory() for n in nodes}
        self.copies: dict[str, dict[str, float]] = {}  # tensor -> holder -> ready time
        self.readers_left: dict[str, int] = {}
        self.last_read: dict[str, dict[str, float]] = {}  # tensor -> holder -> last use
        self.intervals: dict[str, dict[str, _Interval]] = {}  # tensor -> node -> interval
        self.placed: dict[str, TaskPlacement] = {}
        self.outputs = set(graph.outputs)
        for nid, users in graph.consumers().items():
            self.readers_left[nid] = len(set(users))
        for nid, n in graph.nodes.items():
            if n.op == "input":
                where = locations.get(nid, SCHEDULER)
                self.copies[nid] = {where: 0.0}
                if where in self.memory:
                    self._hold(nid, where, 0.0)
                elif where != SCHEDULER:
                    raise ValueError(f"input {nid!r} is said to be on {where!r}, which is not a node "
                                     f"(nodes: {sorted(self.figures)})")
        # Inputs an executor keeps in its cache: local there (no pull, LocalBytes counts
        # them) but never a pull source (uploads are pulled from their holder), and
        # reclaimable, so they take memory only while tasks placed there read them.
        self.cached: dict[str, frozenset[str]] = {}
        for nid, names in (cached or {}).items():
            if nid in self.copies:
                at = frozenset(names) & (self.memory.keys() - self.copies[nid].keys())
                self.cached[nid] = at
                self.copies[nid].update(dict.fromkeys(sorted(at), 0.0))

    def _hold(self, tensor: str, node: str, start: float) -> None:
        iv = _Interval(tensor, self.graph.nodes[tensor].type.nbytes, start)
        mem = self.memory[node]
        mem.intervals.append(iv)
        mem.open_bytes += iv.bytes
        self.intervals.setdefault(tensor, {})[node] = iv

    def local_bytes(self, task: TaskView, node: str) -> int:
        """Bytes of the task's inputs that already are (or will be) on ``node``."""
        return sum(b for i, b in task.in_bytes.items() if node in self.copies.get(i, {}))

    def open_bytes(self) -> int:
        """Bytes held on all nodes by tensors whose readers are not all placed."""
        return sum(m.open_bytes for m in self.memory.values())

    def net_bytes(self, task: TaskView) -> int:
        """Roughly what placing ``task`` adds to the cluster's memory: its output, less the
        inputs it is the last reader of (copies it pulls are not counted)."""
        freed = sum(b for i, b in task.in_bytes.items()
                    if self.readers_left.get(i) == 1 and i not in self.outputs)
        return task.out.nbytes - freed

    def estimate(self, task: TaskView, node: str) -> Estimate | None:
        """When ``task`` would start and finish on ``node``; None if its memory never fits
        there with what is placed so far."""
        fig = self.figures[node]
        dispatch = max((min(self.copies[i].values()) for i in task.inputs), default=0.0)
        missing = [i for i in task.inputs if node not in self.copies[i]]
        new_bytes = task.out.nbytes + sum(task.in_bytes[i] for i in missing) + sum(
            task.in_bytes[i] for i in self._cache_hits(task, node))
        fit = self.memory[node].earliest_fit(new_bytes, fig.free, dispatch)
        if fit is None:
            return None
        dispatch = fit
        pulls, t = [], dispatch
        for i in sorted(missing, key=lambda i: min(self.copies[i].values())):
            src, secs = self._best_source(i, node, task.in_bytes[i])
            pulls.append(Pull(i, src, task.in_bytes[i], secs))
            t += secs
        ready = max([t, *(self.copies[i][node] for i in task.inputs if node in self.copies[i])])
        start = ready if self.model.inline(task.op) else max(ready, min(self.slots[node]))
        compute = self.model.compute_time(task.cost, fig, task.op)
        return Estimate(node, dispatch, start, start + compute, compute,
                        sum(p.seconds for p in pulls), tuple(pulls), new_bytes)

    def _cache_hits(self, task: TaskView, node: str) -> list[str]:
        """Inputs read from ``node``'s cache that no task placed there reads yet."""
        return [i for i in task.inputs
                if node in self.cached.get(i, ()) and node not in self.intervals.get(i, {})]

    def _best_source(self, tensor: str, dst: str, nbytes: int) -> tuple[str, float]:
        best: tuple[float, str, float] | None = None
        for src, ready in self.copies[tensor].items():
            if src in self.cached.get(tensor, ()):
                continue
            secs = self.model.transfer_time(nbytes, self.figures.get(src), self.figures[dst])
            if best is None or (ready + secs, src) < (best[0], best[1]):
                best = (ready + secs, src, secs)
        assert best is not None
        return best[1], best[2]

    def commit(self, task: TaskView, est: Estimate) -> TaskPlacement:
        """Record ``task`` on ``est.node``: its slot, its output, its pulled copies."""
        node = est.node
        if not self.model.inline(task.op):  # an inline task holds no slot (CostModel.inline)
            slots = self.slots[node]
            slots[slots.index(min(slots))] = est.finish
            self.busy[node] += est.compute_s
        t = est.dispatch
        for p in est.pulls:
            t += p.seconds
            self.copies[p.tensor][node] = t
            self._hold(p.tensor, node, est.dispatch)
            self._read(p.tensor, p.source, t)
        for i in self._cache_hits(task, node):
            self._hold(i, node, est.dispatch)
        self.copies[task.id] = {node: est.finish}
        self._hold(task.id, node, est.start)
        for i in task.inputs:
            self._read(i, node, est.finish)
        for i in task.inputs:
            self.readers_left[i] -= 1
            if self.readers_left[i] == 0:
                self._release(i)
        if self.readers_left.get(task.id, 0) == 0:
            self._release(task.id)
        tp = TaskPlacement(task.id, task.op, node, est.start, est.finish, est.compute_s,
                           est.comm_s, est.pulls)
        self.placed[task.id] = tp
        return tp

    def _read(self, tensor: str, holder: str, until: float) -> None:
        last = self.last_read.setdefault(tensor, {})
        last[holder] = max(last.get(holder, 0.0), until)

    def _release(self, tensor: str) -> None:
        if tensor in self.outputs:
            return
        for node, iv in self.intervals.get(tensor, {}).items():
            if iv.end == math.inf:
                end = self.last_read.get(tensor, {}).get(node, self.copies[tensor][node])
                self.memory[node].close(iv, max(end, iv.start))

    def peak_memory(self) -> dict[str, int]:
        """Each node's largest sum of live intervals (a copy freed at t does not overlap one
        made at t)."""
        peaks = {}
        for node, mem in self.memory.items():
            events = sorted([(iv.start, 1, iv.bytes) for iv in mem.intervals]
                            + [(iv.end, 0, -iv.bytes) for iv in mem.intervals if iv.end != math.inf])
            live = peak = 0
            for _, _, b in events:
                live += b
                peak = max(peak, live)
            peaks[node] = peak
        return peaks


# --- the result ------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskPlacement:
    """Where and when one task is predicted to run (seconds from the job's start)."""

    task: str
    op: str
    node: str
    start: float
    finish: float
    compute_s: float
    comm_s: float
    pulls: tuple[Pull, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "op": self.op, "node": self.node, "start_s": self.start,
                "finish_s": self.finish, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "pulls": [{"tensor": p.tensor, "from": p.source, "bytes": p.bytes, "seconds": p.seconds}
                          for p in self.pulls]}


@dataclass(frozen=True)
class Placement:
    """Task -> node with predicted times, peak memory per node and the makespan."""

    tasks: Mapping[str, TaskPlacement]
    nodes: tuple[str, ...]
    peak_memory: Mapping[str, int]
    makespan: float
    status: Status = SUCCESS

    def node_of(self, task: str) -> str:
        return self.tasks[task].node

    def by_node(self) -> dict[str, list[TaskPlacement]]:
        out: dict[str, list[TaskPlacement]] = {n: [] for n in self.nodes}
        for tp in sorted(self.tasks.values(), key=lambda tp: (tp.start, tp.task)):
            out[tp.node].append(tp)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"makespan_s": self.makespan, "nodes": list(self.nodes),
                "peak_memory_bytes": dict(self.peak_memory), "status": self.status.to_dict(),
                "tasks": [tp.to_dict() for tp in self.tasks.values()]}


# --- list scheduling -------------------------------------------------------------------


def task_view(graph: Graph, nid: str) -> TaskView:
    """The :class:`TaskView` of task ``nid`` (a non-``input`` node) of ``graph``."""
    node = graph.nodes[nid]
    ins = tuple(dict.fromkeys(node.inputs))
    return TaskView(nid, node, ins, {i: graph.nodes[i].type.nbytes for i in ins}, node.type,
                    task_cost(graph, nid), in_dtypes=tuple(graph.nodes[i].dtype for i in ins))


def task_views(graph: Graph) -> dict[str, TaskView]:
    """A :class:`TaskView` for every task (non-``input`` node) of ``graph``."""
    return {nid: task_view(graph, nid) for nid, node in graph.nodes.items() if node.op != "input"}


def upward_ranks(graph: Graph, views: Mapping[str, TaskView], nodes: Sequence[NodeFigures],
                 model: CostModel) -> dict[str, float]:
    """HEFT's upward rank: mean compute time plus the longest mean (transfer + rank) path
    to any consumer."""
    bw = sum(n.bandwidth_gbps for n in nodes) / len(nodes)
    lat = sum(n.latency_us for n in nodes) / len(nodes) * 1e-6
    users = graph.consumers()
    rank: dict[str, float] = {}
    for nid in reversed(graph.topo_order()):
        v = views.get(nid)
        if v is None:
            continue
        w = sum(model.compute_time(v.cost, n, v.op) for n in nodes) / len(nodes)
        comm = v.out.nbytes / (bw * 1e9) + lat if len(nodes) > 1 else 0.0
        rank[nid] = w + max((comm + rank[u] for u in set(users[nid]) if u in rank), default=0.0)
    return rank


def place(graph: Graph, nodes: Sequence[NodeFigures], *, model: CostModel | None = None,
          locations: Mapping[str, str] | None = None, cached: Mapping[str, Sequence[str]] | None = None,
          framework: Framework | None = None) -> Placement:
    """Place every task of ``graph`` on ``nodes`` to minimise the predicted makespan.

    ``locations`` says where ``input`` tensors are held (default: the scheduler's data
    server, :data:`~triplane.scheduler.compiler.costmodel.SCHEDULER`); ``cached`` names
    the nodes that also keep an input in their cache (reads there need no pull; names
    that are not nodes are ignored, since such knowledge may be stale). Raises
    :class:`PlacementError` naming the task, its op and the limit when no node can run a
    task, or when a plugin answers ``Error``; ``ValueError`` for an empty cluster.
    """
    if not nodes:
        raise ValueError("no nodes to place on (is any executor registered?)")
    if len({n.name for n in nodes}) != len(nodes):
        raise ValueError(f"node names repeat: {[n.name for n in nodes]}")
    model = model or CostModel()
    fw = framework or Framework()
    state = PlacementState(graph, nodes, model, locations or {}, cached)
    views = task_views(graph)
    rank = upward_ranks(graph, views, nodes, model)
    position = {nid: k for k, nid in enumerate(graph.topo_order())}
    waiting = {nid: sum(1 for i in v.inputs if i in views) for nid, v in views.items()}
    users = graph.consumers()
    total_free = sum(n.free for n in nodes)
    ready = [nid for nid, w in waiting.items() if w == 0]
    while ready:
        pressed = state.open_bytes() > fw.pressure * total_free
        ready.sort(key=lambda t: ((state.net_bytes(views[t]) if pressed else 0), -rank[t], position[t]))
        nid = _place_first(ready, views, nodes, state, fw)
        ready.remove(nid)
        for u in set(users[nid]):
            if u in waiting:
                waiting[u] -= 1
                if waiting[u] == 0:
                    ready.append(u)
    makespan = max((tp.finish for tp in state.placed.values()), default=0.0)
    return Placement(dict(state.placed), tuple(n.name for n in nodes), state.peak_memory(), makespan)


def _place_first(ready: list[str], views: Mapping[str, TaskView], nodes: Sequence[NodeFigures],
                 state: PlacementState, fw: Framework) -> str:
    """Place the first task of ``ready`` that fits somewhere now; its id. A task that is
    only ``Unschedulable`` (memory held by tensors still to be read) gives way to the
    next, whose placement may free that memory; if none fits, the first one's error."""
    first: PlacementError | None = None
    for nid in ready:
        try:
            _place_one(views[nid], nodes, state, fw)
            return nid
        except PlacementError as e:
            if e.status.code is not Code.UNSCHEDULABLE:
                raise
            first = first or e
    assert first is not None
    raise first


def _place_one(task: TaskView, nodes: Sequence[NodeFigures], state: PlacementState, fw: Framework) -> None:
    feasible: list[Estimate] = []
    failed: dict[str, dict[str, Status]] = {}  # plugin -> node -> status
    for node in nodes:
        est = state.estimate(task, node.name)
        for f in fw.filters:
            try:
                st = f.filter(task, node, est, state)
            except Exception as e:  # a plugin's bug must name the plugin, not crash blindly
                st = Status(Code.ERROR, f"filter {f.name} raised {type(e).__name__}: {e}", f.name)
            if st.code is Code.ERROR:
                raise PlacementError(st, node=task.id, op=task.op, what=task.describe())
            if not st.ok and st.code is not Code.SKIP:
                failed.setdefault(f.name, {})[node.name] = st
                break
        else:
            if est is not None:
                feasible.append(est)
    if not feasible:
        resolvable = any(s.code is Code.UNSCHEDULABLE for by in failed.values() for s in by.values())
        by_name = {f.name: f for f in fw.filters}
        reason = "; ".join(by_name[p].summarize(task, by, state) for p, by in failed.items())
        code = Code.UNSCHEDULABLE if resolvable else Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        raise PlacementError(Status(code, reason, ",".join(failed)), node=task.id, op=task.op,
                             what=task.describe())
    ahead = {e.node: e.finish + _egress(task, e.node, state) for e in feasible}
    best = min(ahead.values())
    tied = [e for e in feasible if ahead[e.node] <= best + fw.tie_s]
    chosen = tied[0] if len(tied) == 1 else _by_score(task, tied, state, fw)
    for b in fw.binders:
        st = b.bind(task, chosen, state)
        if st.code is Code.SKIP:
            continue
        if not st.ok:
            raise PlacementError(st, node=task.id, op=task.op, what=task.describe())
        return
    raise PlacementError(Status(Code.ERROR, "no binder bound the task", "Framework"),
                         node=task.id, op=task.op)


SLOW_EGRESS = 4.0
"""A node whose best way out takes this many times the median node's is looked ahead for."""


def _egress(task: TaskView, node: str, state: PlacementState) -> float:
    """With per-pair figures, a look ahead: a node whose best way out (its fastest pair,
    its shortest latency) would take over ``SLOW_EGRESS`` times the median node's to move
    the task's output is charged that move, when the output has readers. Zero otherwise:
    pairs alike (or within measurement noise) change nothing, and a slowed peer gets no
    work that others would then have to pull from it."""
    if not state.egress or not state.readers_left.get(task.id):
        return 0.0
    costs = state._egress_of.get(task.id)
    if costs is None:
        nbytes = task.out.nbytes
        raw = {n: nbytes * per_byte + lat for n, (per_byte, lat) in state.egress.items()}
        mid = sorted(raw.values())[len(raw) // 2]
        costs = state._egress_of[task.id] = {n: (c if c > SLOW_EGRESS * mid else 0.0) for n, c in raw.items()}
    return costs.get(node, 0.0)


def _by_score(task: TaskView, tied: list[Estimate], state: PlacementState, fw: Framework) -> Estimate:
    totals = [0.0] * len(tied)
    for plugin, weight in fw.scores:
        raw = [plugin.score(task, state.figures[e.node], e, state) for e in tied]
        lo, hi = min(raw), max(raw)
        for k, r in enumerate(raw):
            # k8s NormalizeScore: 0..100 over the candidates; all equal -> all 100
            totals[k] += weight * (100.0 if hi == lo else 100.0 * (r - lo) / (hi - lo))
    k = max(range(len(tied)), key=lambda k: (totals[k], -k))
    return tied[k]
