"""From a submitted graph to the dispatcher's tasks: pure functions, no I/O.

Given the cluster's figures, the plan is first laid out (``layout.lay_out``: tiled and
placed; tiny graphs stay whole). Every non-input node of what runs -- the plan graph, or
the tile graph -- is one task computing one tile:

* task id = the plan node id (``n0``, ``n17``, ...), or ``t0``, ``t1``, ... for a tile
  graph; its output tile is ``<job>.<task>``; a placed task names its node (followed by
  the dispatcher while that node is alive);
* an ``input`` node is no task: its tile is the uploaded tensor (``u-<32 hex>``), held by
  the scheduler's data server, which packets name as node ``scheduler``; a ``slice`` of
  an upload (steps 1: how the tiler reads an input's tile) reads the *region* tile
  ``u-<32 hex>@lo:hi,lo:hi`` instead, which the data server cuts out of the upload, so an
  executor never pulls a whole large upload for one tile of it;
* a task's ``deps`` are its inputs that are tasks; its cost comes from the op table's
  cost at a nominal rate (``NOMINAL_FLOPS`` / ``NOMINAL_BYTES_PER_S``).

**Grouped tasks.** A tiny job (tensors totalling at most ``UNSPLIT_BYTES``, between 2 and
``MAX_GROUP_TASKS`` task nodes) is instead one task, ``g``, that runs the whole plan on one
executor (``group.py``; op ``graph``, docs/runtime.md "Grouped jobs"): a training step of
small layers is one packet round trip, not one per node. Its output tiles are named as
the per-node tasks' would be (``<job>.<node>``, one per graph output), and
``JobPlan.group`` maps each of those nodes to ``g``, so a fetch finds their holder. A
program too big for a packet, or ``group=False``, falls back to one task per node.

This is the last stage of :func:`~triplane.scheduler.compiler.compile.compile_job` (the one
entry); ``plan_job`` raises :class:`~triplane.proto.errors.GraphError` (naming the user's
node and op) for anything wrong with the graph or the fetch list, before anything is stored.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triplane.proto import optable
from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph, Node, TensorType, thaw
from triplane.proto.packet import canonical
from triplane.proto.validate import Limits
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.group import GROUP_TASK, grouped
from triplane.scheduler.compiler.layout import (
    UNSPLIT_BYTES,
    WHOLE_COMPUTE_S,
    Cached,
    Layout,
    bigger_than,
    lay_out,
)
from triplane.scheduler.compiler.pipeline import CompileOptions, Plan, PlanCache
from triplane.scheduler.compiler.placement import PlacementError
from triplane.scheduler.compiler.tiling import TileGrid
from triplane.scheduler.dispatch.state import TaskSpec

NOMINAL_FLOPS = 1e9  # per second: a modest core; deadlines are 10x the cost anyway
NOMINAL_BYTES_PER_S = 2e9
SCHEDULER_NODE = "scheduler"
MAX_ATTRS_BYTES = 48 * 1024  # a task packet is at most 64 KiB framed; leave room for the rest

_JOB_ID = re.compile(r"j[0-9a-f]{16}")
_TENSOR_ID = re.compile(r"u-[0-9a-f]{32}")
_TILE_ID = re.compile(r"j[0-9a-f]{16}\.[nt][0-9]+")


def new_job_id() -> str:
    """``j`` + 16 lowercase hex digits."""
    return "j" + secrets.token_hex(8)


def new_tensor_id() -> str:
    """``u-`` + 32 lowercase hex digits: an uploaded tensor."""
    return "u-" + secrets.token_hex(16)


def is_job_id(s: str) -> bool:
    return _JOB_ID.fullmatch(s) is not None


def is_tensor_id(s: str) -> bool:
    return _TENSOR_ID.fullmatch(s) is not None


def is_job_tile(s: str) -> bool:
    """A task's output tile ``<job>.<task>``: what a ref (``scheduler/refs.py``) binds an input to."""
    return _TILE_ID.fullmatch(s) is not None


def tile_id(job: str, task: str) -> str:
    """The id of a task's output tile."""
    return f"{job}.{task}"


@dataclass(frozen=True)
class TaskTemplate:
    """What a task packet needs besides its attempt, deadline and peer pulls."""

    op: str
    inputs: tuple[str, ...]  # input tile ids in argument order
    uploads: tuple[str, ...]  # those of ``inputs`` that are uploads (pulled from the scheduler)
    attrs: Mapping[str, Any]  # JSON-ready
    out: TensorType
    tiles: tuple[str, ...] = ()  # a grouped task: the plan nodes it stores (tiles <job>.<node>)

    def outputs(self, job: str, task: str) -> tuple[str, ...]:
        """The output tile ids of ``task`` of ``job``."""
        return tuple(tile_id(job, n) for n in self.tiles) if self.tiles else (tile_id(job, task),)


@dataclass(frozen=True)
class JobPlan:
    """A job ready for the dispatcher. ``fetch`` maps each fetched name of the submitted
    graph to the plan node holding its value (a task id, or an ``input`` node)."""

    job: str
    plan: Plan
    specs: tuple[TaskSpec, ...]
    templates: Mapping[str, TaskTemplate]
    uploads: Mapping[str, str]  # plan input node -> uploaded tensor id
    fetch: Mapping[str, str]
    ops: frozenset[str]
    back: Mapping[str, str]  # plan node id -> submitted node id (errors name the user's)
    layout: Layout | None = None  # None: laid out for no cluster (one task per plan node)
    graph: Graph | None = None  # the canonical graph compiled (what the metadb stores)
    args: tuple[str, ...] = ()  # the uploaded tensor ids bound to ``arg0, arg1, ...``
    group: Mapping[str, str] = dataclasses.field(default_factory=dict)  # node -> its grouped task

    def task_of(self, nid: str) -> str:
        """The task whose output tile ``<job>.<nid>`` is (``nid`` itself unless grouped)."""
        return self.group.get(nid, nid)

    def task_tiles(self, task: str) -> tuple[str, ...]:
        """The output tile ids of ``task``."""
        tpl = self.templates.get(task)
        return tpl.outputs(self.job, task) if tpl is not None else (tile_id(self.job, task),)

    def node_with_op(self, op: str) -> str | None:
        """A plan node running ``op`` (errors name it), or None."""
        g = self.layout.graph if self.layout is not None else self.plan.graph
        return next((n for n, node in g.nodes.items() if node.op == op), None)

    def fetch_tile(self, name: str) -> tuple[str, str | None]:
        """(tile id, task id or None for an upload) of a fetched name held in one tile;
        KeyError if not fetched, ValueError if it is split into several tiles
        (:meth:`fetch_grid`)."""
        nid = self.fetch[name]
        if nid in self.uploads:
            return self.uploads[nid], None
        grid = self.fetch_grid(name)
        if grid is None:
            return tile_id(self.job, nid), self.group.get(nid, nid)
        if len(grid) != 1:
            raise ValueError(f"{name!r} is held in {len(grid)} tiles")
        task = grid.tiles[next(iter(grid.cells()))]
        return tile_id(self.job, task), task

    def fetch_grid(self, name: str) -> TileGrid | None:
        """The grid of tasks holding a fetched (non-upload) name of a tiled job, else None."""
        lay = self.layout
        nid = self.fetch[name]
        if lay is None or not lay.tiled or nid in self.uploads:
            return None
        return lay.grids[nid]


def cost_seconds(flops: float, nbytes: float) -> float:
    return flops / NOMINAL_FLOPS + nbytes / NOMINAL_BYTES_PER_S


def with_fetch(graph: Graph, fetch: Sequence[str]) -> Graph:
    """``graph`` with every fetched node among its outputs (GraphError for an unknown name)."""
    for i, name in enumerate(fetch):
        if not isinstance(name, str) or name not in graph.nodes:
            raise GraphError(f"fetch[{i}] = {name!r} is not a node of the graph", node=str(name))
    extra = [n for n in dict.fromkeys(fetch) if n not in graph.outputs]
    return Graph(graph.nodes, (*graph.outputs, *extra), graph.version) if extra else graph


def plan_job(
    job: str,
    cgraph: Graph,
    args: Sequence[str],
    fetch: Mapping[str, str],
    back: Mapping[str, str],
    cache: PlanCache,
    *,
    limits: Limits | None = None,
    options: CompileOptions | None = None,
    figures: Sequence[NodeFigures] | None = None,
    explicit: Mapping[str, Mapping[str, Any]] | None = None,
    cached: Cached | None = None,
    group: bool = True,
    held: Mapping[str, Sequence[Sequence[int]]] | None = None,
    whole_s: float = WHOLE_COMPUTE_S,
    whole: bool = False,
) -> JobPlan:
    """The job of a canonical graph: ``args`` binds ``argN`` inputs to uploaded tensor ids,
    ``fetch`` maps fetched names to canonical ids, ``back`` canonical ids to submitted ones.
    With ``figures`` (the executors) the plan is tiled and placed first (``lay_out``;
    LimitError / PlacementError naming the submitted node when it cannot fit); ``cached``
    (``Residency.lookup``) says where upload tiles are cached, for placement. ``group``:
    run a tiny job as one grouped task (the module doc); False keeps one task per node.
    ``held``: ``argN`` -> the tile boundaries of a value held in tiles (``lay_out``);
    ``whole_s``: ``lay_out``'s bound for keeping a graph whole; ``whole``: group the job
    whatever its size (a stored job recorded so: ``earlier.plan_again``)."""
    key = None
    if options is None and limits is None and explicit is None and not held and group:
        # a compiled step: the grouped job planned for an earlier step, bound to new inputs
        key = (id(cgraph), whole, whole_s, tuple(f.ops for f in figures) if figures else None)
        again = _rebound(key, cgraph, job, args, fetch, back)
        if again is not None:
            return again
    if options is None:
        options = CompileOptions(limits=limits) if limits else CompileOptions()
    lay = (figures, explicit, cached, held, whole_s)
    try:
        planned = _plan_job(job, cgraph, args, fetch, back, cache, options, lay)
    except _PacketTooSmall:
        # Fusion made a program too big for one packet: run the chain unfused instead.
        planned = _plan_job(job, cgraph, args, fetch, back, cache, dataclasses.replace(options, fuse=False),
                            lay)
    if not group or explicit or not _runs_anywhere(planned.templates.values(), figures):
        return planned
    lay_ = planned.layout
    g = grouped(job, planned.plan, planned.uploads, planned.specs, planned.templates,
                untiled=lay_ is None or not lay_.tiled, max_attrs_bytes=MAX_ATTRS_BYTES,
                whole=whole or (lay_ is not None and not lay_.tiled))
    if g is None:
        return planned
    template = TaskTemplate(g.spec.op, g.inputs, g.pulled, g.attrs, g.out, g.tiles)
    out = dataclasses.replace(planned, specs=(g.spec,), templates={GROUP_TASK: template},
                              group=dict.fromkeys(g.tiles, GROUP_TASK))
    if key is not None and (lay_ is None or not lay_.tiled) and not bigger_than(cgraph, UNSPLIT_BYTES):
        _remember(key, cgraph, out)
    return out


@dataclass(frozen=True)
class _Bound:
    """A grouped job planned before, to bind to new inputs: for its grouped task's inputs
    and pulled tiles, and for its input nodes, the index of the argument each one is."""

    graph: Graph
    fetch: Mapping[str, str]
    back: Mapping[str, str]
    planned: JobPlan
    inputs: tuple[int, ...]
    pulled: tuple[int, ...]
    uploads: tuple[tuple[str, int], ...]
    at: float


# (graph, grouping, the executors' ops) -> the grouped job last planned for it. A compiled
# training step plans the same small graph every step: binding the last plan to the step's
# job id and inputs skips the walk over every plan node (a tenth of the scheduler's step).
# Its costs are planned in full again every REPLAN_S (they follow the executors' speeds).
_BOUND: OrderedDict[tuple[Any, ...], _Bound] = OrderedDict()
_BOUND_KEPT = 64
_BOUND_LOCK = threading.Lock()
REPLAN_S = 2.0


def _remember(key: tuple[Any, ...], cgraph: Graph, planned: JobPlan) -> None:
    """Keep ``planned`` (a grouped, untiled job) for :func:`_rebound` when each of its
    grouped task's inputs is one whole argument, every argument distinct."""
    args = planned.args
    where = {a: i for i, a in enumerate(args)}
    tpl = planned.templates[GROUP_TASK]
    if len(where) != len(args) or any(t not in where for t in (*tpl.inputs, *tpl.uploads,
                                                                   *planned.uploads.values())):
        return  # a region of an upload, an argument given twice: planned in full each time
    bound = _Bound(cgraph, planned.fetch, planned.back, planned, tuple(where[t] for t in tpl.inputs),
                   tuple(where[t] for t in tpl.uploads),
                   tuple((n, where[t]) for n, t in planned.uploads.items()), time.monotonic())
    with _BOUND_LOCK:  # plans are made on the event loop and in worker threads
        _BOUND[key] = bound
        _BOUND.move_to_end(key)
        while len(_BOUND) > _BOUND_KEPT:
            _BOUND.popitem(last=False)


def _rebound(key: tuple[Any, ...], cgraph: Graph, job: str, args: Sequence[str], fetch: Mapping[str, str],
             back: Mapping[str, str]) -> JobPlan | None:
    """The job :func:`_remember` kept for ``key``, bound to ``job`` and ``args``; None when
    there is none for this graph, fetch list and arguments, or it is due to be planned again."""
    b = _BOUND.get(key)
    if (b is None or b.graph is not cgraph or time.monotonic() - b.at > REPLAN_S
            or len(args) != len(b.planned.args) or b.fetch != fetch or b.back != back):
        return None
    if not all(is_tensor_id(a) or is_job_tile(a) for a in args):
        return None  # planned in full: its error names the input
    tpl = b.planned.templates[GROUP_TASK]
    bound = dataclasses.replace(tpl, inputs=tuple(args[i] for i in b.inputs),
                                uploads=tuple(dict.fromkeys(args[i] for i in b.pulled)))
    return dataclasses.replace(b.planned, job=job, templates={GROUP_TASK: bound},
                               uploads={n: args[i] for n, i in b.uploads}, args=tuple(args))


def _runs_anywhere(templates: Any, figures: Sequence[NodeFigures] | None) -> bool:
    """Whether every node can run every op of the plan (a ``fused`` task's program steps
    too): a grouped task may go to any executor, so a job using an op only some executors
    have (a plugin's, docs/plugins.md) keeps one task per node, placed where it runs."""
    if not figures:
        return True
    ops = {t.op for t in templates}
    ops |= {step[0] for t in templates if t.op == "fused" for step in t.attrs.get("program", ())}
    return all(f.supports_op(op) for f in figures for op in ops)


class _PacketTooSmall(GraphError):
    pass


def _plan_job(
    job: str,
    cgraph: Graph,
    args: Sequence[str],
    fetch: Mapping[str, str],
    back: Mapping[str, str],
    cache: PlanCache,
    options: CompileOptions,
    lay: tuple[Sequence[NodeFigures] | None, Mapping[str, Mapping[str, Any]] | None, Cached | None,
               Mapping[str, Sequence[Sequence[int]]] | None, float] = (None, None, None, None, 0.0),
) -> JobPlan:
    try:
        plan = cache.get_or_compile(cgraph, options)
    except GraphError as e:
        raise _renamed(e, back) from None
    plan_uploads = _uploads(plan.graph, args, back)
    layout: Layout | None = None
    figures, explicit, cached, held, whole_s = lay
    if figures:
        try:
            layout = lay_out(plan.graph, figures, explicit=explicit, cached=cached, held=held,
                             whole_s=whole_s)
        except PlacementError as e:
            name = back.get(e.node or "", e.node)
            what = e.what.replace(repr(e.node), repr(name), 1) if e.node else e.what
            raise PlacementError(e.status, node=name, op=e.op, what=what) from None
        except GraphError as e:
            raise _renamed(e, back) from None
    g = layout.graph if layout is not None else plan.graph
    uploads = _uploads(g, args, back) if layout is not None and layout.tiled else plan_uploads
    if layout is not None:
        for nid, (_, reg) in layout.regions.items():
            uploads[nid] = region_tile(uploads[nid], reg)
    placed = layout.placement if layout is not None else None
    outputs = set(g.outputs)
    specs: list[TaskSpec] = []
    templates: dict[str, TaskTemplate] = {}
    # Once per node of a graph of up to 10^4-10^5 tasks, on the submit's critical path (the
    # executors wait for it): what depends on the graph alone is worked out once per graph.
    for nid, node, op, out_type, c, attrs, size in _node_facts(g):
        ins = node.inputs
        if size > MAX_ATTRS_BYTES:
            raise (_PacketTooSmall if op == "fused" and options.fuse else GraphError)(
                f"attributes of {size} bytes do not fit a task packet "
                f"(at most {MAX_ATTRS_BYTES}); upload large data as a tensor",
                node=back.get(nid, nid),
                op=op,
            )
        if ins:
            in_tiles = tuple(uploads[i] if i in uploads else tile_id(job, i) for i in ins)
            region = _upload_region(node, g, uploads)
            if region is not None:
                in_tiles, attrs = region
            deps = tuple(dict.fromkeys(i for i in ins if i not in uploads))
            pulled = tuple(dict.fromkeys(t for t, i in zip(in_tiles, ins) if i in uploads))
        else:
            in_tiles = deps = pulled = ()
        tp = placed.tasks.get(nid) if placed is not None else None
        cost = tp.compute_s + tp.comm_s if tp is not None else cost_seconds(c.flops, c.bytes)
        specs.append(TaskSpec(nid, op, deps, cost, out_type.nbytes, nid in outputs, tp.node if tp else None,
                              tp.start if tp else 0.0))
        templates[nid] = TaskTemplate(op, in_tiles, pulled, attrs, out_type)
    return JobPlan(
        job,
        plan,
        tuple(specs),
        templates,
        plan_uploads,
        dict(fetch),
        frozenset(t.op for t in templates.values()),
        dict(back),
        layout,
        cgraph,
        tuple(args),
    )


# graph -> what _plan_job reads of each non-input node that depends on the graph alone: a
# compiled training step plans the same graph every step (the plan cache's object), and
# its fused programs' costs and attribute sizes took about a tenth of the scheduler's step.
_FACTS: OrderedDict[int, tuple[Graph, list[tuple[str, Node, str, TensorType, Any, dict[str, Any], int]]]] = \
    OrderedDict()
_FACTS_KEPT = 128


def _node_facts(g: Graph) -> list[tuple[str, Node, str, TensorType, Any, dict[str, Any], int]]:
    """Per non-input node of ``g``, in order: (id, node, op, output type, cost, thawed
    attributes, their canonical size or 0 when surely small). The attributes are shared by
    the jobs of ``g``: nothing changes a template's attributes."""
    kept = _FACTS.get(id(g))
    if kept is not None and kept[0] is g:
        _FACTS.move_to_end(id(g))
        return kept[1]
    nodes = g.nodes
    types = {nid: node.type for nid, node in nodes.items()}
    facts = []
    for nid, node in nodes.items():
        op = node.op
        if op == "input":
            continue
        out_type = types[nid]
        c = optable.get(op).cost([types[i] for i in node.inputs], out_type, node.attrs)
        attrs = thaw(node.attrs) if node.attrs else {}
        size = 0 if not attrs or _surely_small(attrs) else len(canonical(attrs))
        facts.append((nid, node, op, out_type, c, attrs, size))
    _FACTS[id(g)] = (g, facts)
    if len(_FACTS) > _FACTS_KEPT:
        _FACTS.popitem(last=False)
    return facts


_SMALL_SCALARS = (bool, int, float, type(None))


def _surely_small(attrs: Mapping[str, Any], budget: int = MAX_ATTRS_BYTES // 2) -> bool:
    """True when the canonical JSON of ``attrs`` (thawed) is certainly at most ``budget``
    bytes, judged without encoding it: scalars (a float or an int within 2**53 is at most
    24 characters), and strings and flat lists counted generously. False means "measure it"."""
    size = 2
    for k, v in attrs.items():
        size += len(k) * 6 + 4  # a key escaped at worst, quotes, colon, comma
        t = type(v)
        if t in _SMALL_SCALARS:
            size += 26
        elif t is str:
            size += len(v) * 6 + 2
        elif t is list and len(v) <= 64 and all(type(x) in _SMALL_SCALARS for x in v):
            size += 27 * len(v) + 2
        else:
            return False
        if size > budget:
            return False
    return True


def _uploads(g: Graph, args: Sequence[str], back: Mapping[str, str]) -> dict[str, str]:
    """Input node -> uploaded tensor id (or the job tile a ref resolved to, pulled from its
    holder); GraphError for a binding that is neither."""
    uploads: dict[str, str] = {}
    for nid, node in g.nodes.items():
        if node.op == "input":
            tensor = args[int(str(node.attrs["tensor"])[3:])]
            if not is_tensor_id(tensor) and not is_job_tile(tensor):
                raise GraphError(
                    f"input tensor {tensor!r} is not an uploaded tensor id (u-<32 hex>) "
                    "or a ref (<job>:<name>)",
                    node=back.get(nid, nid),
                    op="input",
                )
            uploads[nid] = tensor
    return uploads


def region_tile(tensor: str, region: Sequence[tuple[int, int]]) -> str:
    """The id of a region of an upload: ``u-<hex>@lo:hi,lo:hi`` (served by the data server)."""
    return f"{tensor}@" + ",".join(f"{lo}:{hi}" for lo, hi in region)


def _upload_region(
    node: Any, g: Graph, uploads: Mapping[str, str]
) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """(input tiles, attrs) reading a region tile for a step-1 ``slice`` of a whole upload
    of rank >= 1, else None. The slice stays (as an identity on the region) so the executor
    still checks the type it receives."""
    if node.op != "slice" or len(node.inputs) != 1 or node.inputs[0] not in uploads \
            or not is_tensor_id(uploads[node.inputs[0]]):  # an executor serves no regions of a ref
        return None
    src = g.nodes[node.inputs[0]]
    steps = tuple(node.attrs.get("steps") or ())
    if not src.shape or any(int(s) != 1 for s in steps) or len(steps) != len(src.shape):
        return None
    starts, stops = tuple(node.attrs["starts"]), tuple(node.attrs["stops"])
    if tuple(int(a) for a in starts) == (0,) * len(src.shape) and tuple(int(b) for b in stops) == src.shape:
        return None  # the whole upload: read it as it is
    region = tuple((int(a), int(b)) for a, b in zip(starts, stops))
    shape = tuple(b - a for a, b in region)
    attrs = {"starts": [0] * len(shape), "stops": list(shape), "steps": [1] * len(shape)}
    return (region_tile(uploads[node.inputs[0]], region),), attrs


def _renamed(e: GraphError, back: Mapping[str, str]) -> GraphError:
    """``e`` naming the submitted node instead of the canonical one."""
    if e.node is None:
        return e
    return type(e)(e.reason, node=back.get(e.node, e.node), op=e.op, where=e.where)


def unsupported_op(ops: Iterable[str], engine_ops: Iterable[Iterable[str]]) -> str | None:
    """The first op (sorted) no registered engine lists, else None."""
    known: set[str] = set()
    for e in engine_ops:
        known.update(e)
    return next((op for op in sorted(ops) if op not in known), None)
