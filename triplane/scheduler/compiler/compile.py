"""The one compile entry: a graph, what to fetch and a snapshot of the cluster in, the
execution plan (:class:`~triplane.scheduler.compiler.jobplan.JobPlan`) out.

Every compile of a job goes through :func:`compile_job`: a submit (a graph as the client
sent it), the resume of an unfinished job after a restart and the rebuild of a done job an
earlier process ran (the canonical graph and bindings the metadb holds, ``args=``). Its
stages, in order:

1. canonicalisation (``Graph.canonical``: node ids ``n0, n1, ...``, inputs ``argN``) of the
   graph with every fetched node among its outputs -- skipped for a stored graph;
2. the passes (``pipeline.compile_graph``: validation, DCE, CSE, folding, fusion, memory
   planning), through the plan cache keyed by canonical graph hash, so a graph seen
   before (a training step's next submit) skips them;
3. tiling and placement for the cluster's figures (``layout.lay_out``; tiny graphs stay
   whole and are placed on demand);
4. the dispatcher's tasks and packet templates (``jobplan.plan_job``); a tiny job of a few
   nodes becomes one grouped task (``group.py``).

Autograd is not a stage here: the SDKs send a graph whose gradient nodes are already
recorded (``proto`` autograd, the same rules everywhere).

Pure: no registry, metadb or network I/O. What the compiler knows of the cluster is the
:class:`ClusterSnapshot` the caller passes in (``scheduler/cluster.py`` builds it). CPU
bound: call it in a worker thread from the event loop.

Failure semantics: :class:`~triplane.proto.errors.GraphError` (its subclasses
``LimitError`` for a graph that cannot fit, ``PlacementError`` for a task no node can run,
``UnknownOpError``...) naming the *submitted* node and op; nothing is stored or
dispatched before it returns. For a stored record, ``KeyError`` / ``TypeError`` /
``IndexError`` / ``ValueError`` too when its bindings are not what this version wrote
(``earlier.REBUILD_ERRORS``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.jobplan import JobPlan, new_job_id, plan_job, with_fetch
from triplane.scheduler.compiler.layout import WHOLE_COMPUTE_S, Cached
from triplane.scheduler.compiler.pipeline import CompileOptions, PlanCache

__all__ = ["ClusterSnapshot", "compile_job"]


@dataclass(frozen=True)
class ClusterSnapshot:
    """What the compiler knows of the cluster, read by the caller before compiling.

    ``figures``: the executors (op-engine speed, memory, network, slots), calibrated to
    how fast they run now; empty: no executor is registered, the plan is not laid out (one
    task per plan node, placed by the dispatcher). ``cached``: given the job's uploaded
    tensor ids (``arg0, arg1, ...``), which executors keep which upload tiles cached
    (``Residency.lookup``), so placement reads them there as local. ``held``: given the
    same ids, ``argN`` -> the tile boundaries of each input whose value is held in tiles
    (a tiled ref, ``scheduler/refs.py``): the job reads those tiles (``TileSizes.held``).
    ``whole_s``: a graph the cost model puts under this many seconds on one node (and that
    fits a quarter of a node's memory) is not cut (``layout.stays_whole``; 0: off)."""

    figures: tuple[NodeFigures, ...] = ()
    cached: Callable[[Sequence[str]], Cached] | None = None
    held: Callable[[Sequence[str]], Mapping[str, Sequence[Sequence[int]]]] | None = None
    whole_s: float = WHOLE_COMPUTE_S


def compile_job(
    graph: Graph,
    fetch: Sequence[str] | Mapping[str, str],
    cluster: ClusterSnapshot = ClusterSnapshot(),
    *,
    cache: PlanCache,
    job: str | None = None,
    args: Sequence[str] | None = None,
    options: CompileOptions | None = None,
    explicit: Mapping[str, Mapping[str, object]] | None = None,
    bind: Mapping[str, str] | None = None,
    group: bool = True,
    whole: bool = False,
) -> JobPlan:
    """The execution plan of ``graph`` for ``cluster`` (see the module doc).

    A submitted graph: ``fetch`` lists the node ids the client reads; a new job id is drawn
    unless ``job`` is given. A stored job (``args`` given: the uploaded tensor ids bound to
    ``arg0, arg1, ...``): ``graph`` is its canonical graph and ``fetch`` maps each fetched
    name to its canonical id, as the job's ``job.bindings`` record holds them; a tiled job
    must be given the figures it was laid out for, so that its task ids and tiles are the
    same as the first time. ``explicit`` fixes the cut of chosen plan nodes (tests, bench).
    ``bind`` replaces bound tensor names of a submitted graph (a ref ``<job>:<name>`` ->
    the tile or upload it resolved to, ``scheduler/refs.py``);
    ``group`` False keeps a tiny job at one task per plan node (``compiler/group.py``);
    ``whole``: a stored job recorded as kept whole for its cluster (grouped again whatever
    its size)."""
    if args is None:
        names = list(fetch)
        cgraph, rename, bound = with_fetch(graph, names).canonical()
        fetch_map = {name: rename[name] for name in names}
        if bind:
            bound = [bind.get(b, b) for b in bound]
        back = {v: k for k, v in rename.items()}
    else:
        if not isinstance(fetch, Mapping):
            raise TypeError("a stored job's fetch maps fetched names to canonical node ids")
        cgraph, bound, fetch_map, back = graph, list(args), dict(fetch), {}
    figures = tuple(cluster.figures)
    cached = cluster.cached(bound) if cluster.cached is not None and figures else None
    held = cluster.held(bound) if cluster.held is not None and figures else None
    return plan_job(job or new_job_id(), cgraph, bound, fetch_map, back, cache, options=options,
                    figures=figures, explicit=explicit, cached=cached, group=group, held=held,
                    whole_s=cluster.whole_s, whole=whole)
