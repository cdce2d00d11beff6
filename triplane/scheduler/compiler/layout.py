"""Tiling and placement of a compiled plan for the cluster the registry reports (pure).

:func:`lay_out` is what a submit does after ``compile_graph`` (docs/runtime.md, "Jobs,
tasks and tiles"): from the executors' figures (``costmodel.NodeFigures``: op-engine
GFLOP/s and GB/s, memory capacity and free bytes, network, slots) it sizes tiles
(``plan_sizes``), rewrites the plan into a tile graph (``tile_graph``), names its tasks
``t0, t1, ...`` (the tiler's names, ``y[0,1]`` or ``a@0:8,0:4``, are not valid task ids on
the wire) and places them (``place``). The result, a :class:`Layout`, is what the job
runs, where each task should run and what each output's tiles are.

Tiny graphs (tensors totalling at most ``unsplit_bytes``), and graphs that *stay whole*
(:func:`stays_whole`: they fit a quarter of the smallest executor's memory and the cost
model puts all their compute on one node under ``WHOLE_COMPUTE_S``), are neither tiled nor
placed at submit: they run as the plan graph, one task per node, on whatever node the dispatcher's
own placer picks; their placement is computed on demand (``GET /v1/jobs/{id}/plan``).
That keeps a submit of 10,000 scalar tasks as fast as before (placing them takes
seconds). They are still checked against the engines' ops and dtypes.

Failure semantics: a graph that cannot fit the cluster raises the tiler's ``LimitError``
(naming the tensor and the limit); a task no node can run raises ``PlacementError`` (coded
status; message naming the task's op, its type and the limit). Both name the *plan* node
the task came from (``node``), never a tile id. Nothing is half-done: these run before
the job is stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triplane.proto import optable
from triplane.proto.ir import Graph, Node, TensorType
from triplane.scheduler.compiler.costmodel import CostModel, NodeFigures, type_text
from triplane.scheduler.compiler.placement import (
    Code,
    Placement,
    PlacementError,
    Status,
    SupportsOp,
    place,
    task_view,
)
from triplane.scheduler.compiler.tiling import ClusterFigures, Region, TileGrid, plan_sizes, tile_graph

__all__ = ["MODEL", "UNSPLIT_BYTES", "WHOLE_COMPUTE_S", "Cached", "Layout", "bigger_than", "check_support",
           "figures_from_json", "figures_to_json", "lay_out", "same_host_figures", "stays_whole",
           "structure_hash"]

UNSPLIT_BYTES = 4 << 20  # plan_sizes' default: graphs this small are not cut
MODEL = CostModel()  # the one cost model of tiling and placement: they predict a task's time alike
# A graph whose compute on one node the cost model puts under this stays whole (one task
# per plan node, grouped into one task: jobplan.py) when it also fits WHOLE_MEMORY_SHARE of
# the smallest node's memory. Cutting it would at best divide that time by the number of
# nodes, and every tile costs a packet round trip and, between nodes, a transfer: the large
# MLP step of bench/train.py (1024-2048-2048-10, batch 512; about 0.2 s predicted on one core)
# tiled into 77 tasks on two executors of one 2-core host took 447-496 ms of CPU per step
# in all, whole on one executor 213-243 ms, and less wall time (bench/README.md, session 5).
WHOLE_COMPUTE_S = 0.5
WHOLE_MEMORY_SHARE = 4
# Split rules whose tiles read only the matching tiles of their inputs: a graph of these
# alone (an elementwise chain and its reductions over a big input) is cut with no transfer
# between nodes but the partial sums, so cutting it divides its time by the nodes' count
# at the cost of a packet per tile. Such a graph stays whole only under WHOLE_LOCAL_S
# (bench/compute.py's chain on 8192x8192: 64 ms whole on one executor, 48 ms cut on two).
LOCAL_SPLITS = frozenset({"input", "elementwise", "fused", "reduce", "full", "random", "eye"})
WHOLE_LOCAL_S = 0.02
MAX_PLACED_TASKS = 5000  # placement is superlinear; a bigger untiled graph is not placed on demand

# (an ``input`` node's ``tensor`` attribute ("argN"), the region it reads or None for the
# whole upload) -> the executors that keep that upload tile in their cache.
Cached = Callable[[str, "Region | None"], Sequence[str]]


@dataclass(frozen=True)
class Layout:
    """What a job runs. ``graph``: the plan graph (``tiled`` False) or the tile graph with
    task ids ``t0, t1, ...``. ``grids``: plan node -> its TileGrid whose cells name tasks
    of ``graph`` (tiled only; every output has one). ``origin``: task -> plan node.
    ``placement``: task -> node and predictions (None until computed for a tiny graph).
    ``figures``: the cluster it was laid out for. ``regions``: ``input`` nodes of ``graph``
    that stand for a region of an upload (node -> (whole input node, region)): the tiler's
    ``slice`` of an input becomes such a node, so consumers pull just that region from
    the scheduler's data server (``u-<hex>@lo:hi,...``) and placement counts just its bytes.
    ``cached``: ``input`` nodes of ``graph`` -> executors known to keep that upload tile in
    their cache (placement saw those reads as local). ``sources``: the whole ``input``
    nodes that ``regions`` are cut from (by the id ``regions`` names; ``graph`` drops those
    no task reads whole), so the plan document can show an upload's shape and its tiles.
    ``made``: computed tensors the tiler makes region by region instead of on a grid
    (sources such as a random ``normal``, cut as their readers need): plan node -> (its
    type, ((region, task), ...)), so the plan document can list their tiles too."""

    graph: Graph
    tiled: bool
    grids: Mapping[str, TileGrid]
    origin: Mapping[str, str]
    placement: Placement | None
    figures: tuple[NodeFigures, ...]
    regions: Mapping[str, tuple[str, Region]] = dataclasses.field(default_factory=dict)
    cached: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    sources: Mapping[str, Node] = dataclasses.field(default_factory=dict)
    made: Mapping[str, tuple[TensorType, tuple[tuple[Region, str], ...]]] = dataclasses.field(
        default_factory=dict)

    def preferred(self, task: str) -> str | None:
        p = self.placement
        return p.tasks[task].node if p is not None and task in p.tasks else None

    def placed(self) -> Layout:
        """This layout with a placement (computed now for a tiny graph; PlacementError if
        no node can run a task, ValueError if the graph is too large to place on demand)."""
        if self.placement is not None:
            return self
        tasks = sum(1 for n in self.graph.nodes.values() if n.op != "input")
        if tasks > MAX_PLACED_TASKS:
            raise ValueError(f"the job has {tasks} tasks; plans are computed for at most "
                             f"{MAX_PLACED_TASKS} (it ran on the dispatcher's own choice of nodes)")
        return dataclasses.replace(self, placement=_place(self.graph, self.figures, self.origin, self.cached))


def lay_out(graph: Graph, figures: Sequence[NodeFigures], *, unsplit_bytes: int = UNSPLIT_BYTES,
            explicit: Mapping[str, Mapping[str, Any]] | None = None, cached: Cached | None = None,
            held: Mapping[str, Sequence[Sequence[int]]] | None = None,
            whole_s: float = WHOLE_COMPUTE_S) -> Layout:
    """Tile and place the compiled ``graph`` for ``figures`` (see the module doc).
    ``explicit`` fixes the cut of chosen plan nodes (``TileSizes.explicit``) and forces
    tiling even of a tiny graph. ``cached`` says which executors keep which upload tiles
    (``scheduler/residency.py``): placement counts reading them there as local, so a job
    submitted again runs its tasks where their inputs already are. Only where a task runs
    depends on it, never the tiles or the task ids. ``held``: ``argN`` -> the boundaries of
    the tiles that input's value is held in (a tiled ref; ``TileSizes.held``): a job that
    is cut is cut along them; one that stays whole reads a copy (``scheduler/refs.py``),
    once: its outputs are whole, so a training loop whose step was cut once (the figures
    moved) is whole again from the next step. ``whole_s``: :func:`stays_whole`'s bound (0:
    only graphs of at most ``unsplit_bytes`` stay whole)."""
    figs = tuple(figures)
    if not figs:
        raise ValueError("no executor figures to lay the job out for")
    if not explicit and (not bigger_than(graph, unsplit_bytes)
                         or stays_whole(graph, figs, whole_s)):
        _check_support_once(graph, figs)
        return Layout(graph, False, {}, {}, None, figs)
    headroom = 0.5
    while True:
        try:
            sizes = plan_sizes(ClusterFigures.from_nodes(figs), headroom=headroom,
                               unsplit_bytes=unsplit_bytes, explicit=explicit, model=MODEL)
            if held:
                sizes = dataclasses.replace(sizes, held={
                    nid: held[str(n.attrs.get("tensor"))] for nid, n in graph.nodes.items()
                    if n.op == "input" and str(n.attrs.get("tensor")) in held})
            return _tile_and_place(graph, figs, sizes, cached)
        except PlacementError as e:
            # Unschedulable (not ...AndUnresolvable): the nodes' memory is held by tiles
            # still to be read. Smaller tiles need less at once: halve the task size, a
            # few times, before refusing the graph.
            if e.status.code is not Code.UNSCHEDULABLE or headroom < 0.1:
                raise
            headroom /= 2


def _tile_and_place(graph: Graph, figs: tuple[NodeFigures, ...], sizes: Any, cached: Cached | None) -> Layout:
    tiled = tile_graph(graph, sizes)  # LimitError names the plan node and the limit
    # Task names must mean the same tiles when a restarted scheduler lays the job out again
    # from the stored graph, whose nodes may be stored in another order: name them in an
    # order that depends on the structure only.
    order = tiled.graph.dataflow_order()
    rename = {old: f"t{i}" for i, old in enumerate(order)}
    tn = tiled.graph.nodes
    nodes = {rename[old]: tn[old].replace(inputs=[rename[i] for i in tn[old].inputs]) for old in order}
    outputs = tuple(rename[o] for o in tiled.graph.outputs)
    regions: dict[str, tuple[str, Region]] = {}
    sources: dict[str, Node] = {}
    for old in order:  # an upload's tile is read from the data server, not made by a task
        new = rename[old]
        region = _upload_region(nodes[new], nodes) if tiled.roles.get(old) == "source" else None
        if region is not None and new not in outputs:
            src = nodes[nodes[new].inputs[0]]
            regions[new] = (nodes[new].inputs[0], region)
            sources[nodes[new].inputs[0]] = src
            nodes[new] = src.replace(shape=[hi - lo for lo, hi in region])
    used = {i for n in nodes.values() for i in n.inputs}
    for nid in [n for n, node in nodes.items() if node.op == "input" and n not in used and n not in regions]:
        if nid not in outputs:  # the whole upload is read by no task now
            del nodes[nid]
    tgraph = Graph(nodes, outputs, tiled.graph.version)
    origin = {rename[t]: o for t, o in tiled.origin.items()}
    for old, new in rename.items():  # inputs and anything the tiler left unlabelled
        origin.setdefault(new, old if old in graph.nodes else tiled.origin.get(old, old))
    grids = {nid: dataclasses.replace(g, tiles={c: rename[t] for c, t in g.tiles.items()})
             for nid, g in tiled.grids.items()}
    held = _cached_inputs(tgraph, regions, figs, cached)
    made = {nid: (graph.nodes[nid].type, tuple((reg, rename[t]) for reg, t in pieces))
            for nid, pieces in tiled.pieces.items()
            if nid not in tiled.grids and nid in graph.nodes and graph.nodes[nid].op != "input"
            and all(rename.get(t) in nodes and nodes[rename[t]].op != "input" for _, t in pieces)}
    return Layout(tgraph, True, grids, origin, _place(tgraph, figs, origin, held), figs, regions, held,
                  sources, made)


def _cached_inputs(graph: Graph, regions: Mapping[str, tuple[str, Region]], figs: Sequence[NodeFigures],
                   cached: Cached | None) -> dict[str, tuple[str, ...]]:
    """``input`` node -> the executors (of ``figs``, sorted) keeping its tile cached."""
    if cached is None:
        return {}
    names = {f.name for f in figs}
    held = {}
    for nid, node in graph.nodes.items():
        arg = node.attrs.get("tensor") if node.op == "input" else None
        if arg is not None:
            at = tuple(sorted(set(cached(str(arg), regions[nid][1] if nid in regions else None)) & names))
            if at:
                held[nid] = at
    return held


def _upload_region(node: Node, nodes: Mapping[str, Node]) -> Region | None:
    """The region a step-1 ``slice`` of an ``input`` reads, else None."""
    if node.op != "slice" or len(node.inputs) != 1 or nodes[node.inputs[0]].op != "input":
        return None
    steps = tuple(int(x) for x in node.attrs.get("steps") or ())
    if steps != (1,) * len(node.shape) or not node.shape:
        return None
    return tuple((int(a), int(b)) for a, b in zip(node.attrs["starts"], node.attrs["stops"]))


def _place(graph: Graph, figs: Sequence[NodeFigures], origin: Mapping[str, str],
           cached: Mapping[str, tuple[str, ...]] | None = None) -> Placement:
    try:
        return place(graph, figs, cached=cached, model=MODEL)
    except PlacementError as e:
        raise _named(e, graph, origin) from None


def _named(e: PlacementError, graph: Graph, origin: Mapping[str, str]) -> PlacementError:
    task = e.node or ""
    orig = origin.get(task, task)
    node = graph.nodes.get(task)
    what = f"task {orig!r} ({e.op} -> {type_text(node.type)})" if node is not None else e.what
    return PlacementError(e.status, node=orig, op=e.op, what=what)


def bigger_than(graph: Graph, limit: int) -> bool:
    """Whether the tensors of ``graph`` total more than ``limit`` bytes. Stops at the node
    that passes it, and sizes each (shape, dtype) once: submit-time cost on big graphs."""
    total = 0
    sizes: dict[tuple[tuple[int, ...], str], int] = {}
    for n in graph.nodes.values():
        key = (n.shape, n.dtype)
        size = sizes.get(key)
        if size is None:
            size = sizes[key] = n.type.nbytes
        total += size
        if total > limit:
            return True
    return False


# (id(graph), what the nodes' engines take) -> the graph checked: a training loop submits
# the same plan graph (the plan cache's) every step, and checking a fused node costs its
# program's cost function (~30% of a small step's compile).
_SUPPORTED: OrderedDict[tuple[int, Any], Graph] = OrderedDict()
_WHOLE: OrderedDict[tuple[int, tuple[NodeFigures, ...], float], tuple[Graph, bool]] = OrderedDict()


def stays_whole(graph: Graph, figures: Sequence[NodeFigures], whole_s: float = WHOLE_COMPUTE_S) -> bool:
    """Whether ``graph`` runs uncut (the module doc): its tensors total at most
    1/``WHOLE_MEMORY_SHARE`` of the smallest node's memory capacity and its tasks' predicted
    compute on the fastest node totals at most ``whole_s`` seconds (``WHOLE_LOCAL_S`` for a
    graph of ``LOCAL_SPLITS`` ops on a cluster of several nodes). Depends on the graph
    and the figures only (a resumed job is laid out for its recorded figures again);
    memoised for a training loop's plan, laid out every step."""
    if whole_s <= 0:
        return False
    figs = tuple(figures)
    key = (id(graph), figs, whole_s)
    kept = _WHOLE.get(key)
    if kept is not None and kept[0] is graph:
        _WHOLE.move_to_end(key)
        return kept[1]
    room = min(f.memory_capacity for f in figs) // WHOLE_MEMORY_SHARE
    whole = not bigger_than(graph, room)
    if whole:
        if len(figs) > 1 and _splits_locally(graph):
            whole_s = min(whole_s, WHOLE_LOCAL_S)
        fastest = max(figs, key=lambda f: (f.gflops, f.gbps))
        total = 0.0
        for nid, node in graph.nodes.items():
            if node.op != "input":
                total += MODEL.node_compute_time(graph, nid, fastest)
                if total > whole_s:
                    whole = False
                    break
    _WHOLE[key] = (graph, whole)
    if len(_WHOLE) > 256:
        _WHOLE.popitem(last=False)
    return whole


def _splits_locally(graph: Graph) -> bool:
    """Whether every node's split rule is one of ``LOCAL_SPLITS`` (see there)."""
    for node in graph.nodes.values():
        split = optable.get(node.op).split
        if split is None or split.kind not in LOCAL_SPLITS:
            return False
    return True


def _check_support_once(graph: Graph, figures: Sequence[NodeFigures]) -> None:
    key = (id(graph), frozenset((n.ops, n.dtypes) for n in figures))
    if _SUPPORTED.get(key) is graph:
        _SUPPORTED.move_to_end(key)
        return
    check_support(graph, figures)
    _SUPPORTED[key] = graph
    if len(_SUPPORTED) > 256:
        _SUPPORTED.popitem(last=False)


def check_support(graph: Graph, figures: Sequence[NodeFigures]) -> None:
    """PlacementError (UnschedulableAndUnresolvable) for the first task whose op or dtypes
    no node's engines take; cheap (no placement), for graphs that are not placed at submit."""
    f = SupportsOp()
    checked: set[tuple[str, frozenset[str]]] = set()
    nodes = graph.nodes
    for tid, node in nodes.items():
        # De-duplicated by (op, dtypes) before a view is built: a submit of 10,000 scalar
        # tasks has one or two distinct keys, and a view costs the op's cost function.
        if node.op == "input":
            continue
        key = (node.op if node.op != "fused" else f"fused:{tid}",
               frozenset({node.dtype, *(nodes[i].dtype for i in node.inputs)}))
        if key in checked:
            continue
        checked.add(key)
        view = task_view(graph, tid)
        if any(f.filter(view, n, None, None).ok for n in figures):  # type: ignore[arg-type]
            continue
        lacking = [n for n in figures if not n.supports_op(view.op)]
        if len(lacking) == len(figures):
            reason = f"no engine supports {view.op}"
        else:
            bad = sorted(d for d in view.dtypes if not any(n.supports_dtype(d) for n in figures
                                                            if n.supports_op(view.op)))
            reason = f"no engine supports {view.op} on {', '.join(bad or sorted(view.dtypes))}"
        raise PlacementError(Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason, f.name), node=tid,
                             op=view.op, what=f"task {tid!r} ({view.op} -> {type_text(view.out)})")


def same_host_figures(figures: Sequence[NodeFigures], hosts: Mapping[str, str],
                      cpus: Mapping[str, int] | None = None) -> list[NodeFigures]:
    """``figures`` with the best GFLOP/s, GB/s, network bandwidth and latency of each host
    (``hosts``: node -> address) given to every node on it. Executors started together on
    one machine benchmark at the same moment and disturb each other (measured here: 1.8,
    5.5 and 125 GFLOP/s for three executors of one 2-core host; 0.75 and 0.12 GB/s for the
    loopback of two), and placement would then crowd every task onto the luckiest one --
    with cached uploads, for good; they measure the same hardware, so the best figure is
    the honest one.

    More executors on a host than it has cores (``cpus``: node -> cores it may use, 0 when
    not reported) share them: each gets ``cores / executors`` of the compute figures.
    Placement gives a node one lane at its figures, so three executors on two cores at
    full speed each promised half again the machine (measured here: the 12288^2 matmul on
    three executors of a 2-core host ran 2.6x its prediction, most of it this)."""
    cpus = cpus or {}
    best: dict[str, tuple[float, float, float, float]] = {}
    members: dict[str, int] = {}
    cores: dict[str, int] = {}
    for n in figures:
        h = hosts.get(n.name)
        if h is not None:
            g, b, bw, lat = best.get(h, (0.0, 0.0, 0.0, math.inf))
            best[h] = (max(g, n.gflops), max(b, n.gbps), max(bw, n.bandwidth_gbps), min(lat, n.latency_us))
            members[h] = members.get(h, 0) + 1
            cores[h] = max(cores.get(h, 0), cpus.get(n.name, 0))
    out = []
    for n in figures:
        h = hosts.get(n.name)
        if h is None:
            out.append(n)
            continue
        g, b, bw, lat = best[h]
        share = min(1.0, cores[h] / members[h]) if cores[h] > 0 else 1.0
        out.append(dataclasses.replace(n, gflops=g * share, gbps=b * share, bandwidth_gbps=bw,
                                       latency_us=lat))
    return out


# --- figures on record (a resumed job is laid out again exactly) ---------------------------


_FIELDS = ("name", "gflops", "gbps", "memory_capacity", "memory_free", "bandwidth_gbps", "latency_us",
           "slots")


def figures_to_json(figures: Sequence[NodeFigures]) -> list[dict[str, Any]]:
    """The numbers tiling and placement read (ops/dtypes are left out: a resumed job was
    checked against them when it was submitted)."""
    return [{**{k: getattr(n, k) for k in _FIELDS}, "links": [list(x) for x in n.links]} for n in figures]


def figures_from_json(doc: Any) -> list[NodeFigures]:
    """Inverse of :func:`figures_to_json`; ValueError/TypeError/KeyError for a bad record."""
    if not isinstance(doc, list):
        raise TypeError("figures must be a list")
    return [NodeFigures(**{k: d[k] for k in _FIELDS},  # links: absent from records before them
                        links=tuple((str(p), float(b), float(t)) for p, b, t in d.get("links", ())))
            for d in doc]


def structure_hash(figures: Sequence[NodeFigures]) -> str:
    """A short hash of the cluster's figures (the metadb plans table's ``structure_hash``)."""
    text = json.dumps(figures_to_json(figures), sort_keys=True, separators=(",", ":"))
    return "s" + hashlib.sha256(text.encode()).hexdigest()[:40]
