"""Jobs an earlier scheduler process ran: their tensors and recorded plans, from the metadb.

A done job outlives the process that ran it: the executors keep its fetched tiles until
``DELETE /v1/jobs/{id}``, and the metadb keeps what names them -- the canonical graph,
the ``job.bindings`` event (upload ids, fetched names, and the figures a tiled job was
laid out for), and the task rows (a done task's row names the node holding its output
tile, docs/scheduler.md). Compiling the graph again with those figures gives the same
task ids and tile grids as the first time (resuming a job relies on the same), so
a restarted scheduler reads the tiles where they are, exactly as for a job it ran.

A release (``DELETE``) is recorded as a ``job.released`` event, so whichever process
answers next knows the tiles are gone. The prediction made at submit is the job's row in
the ``plans`` table (``jobs.plan_id``); the actual times beside it come from the task rows
(a done task's row holds its kernel's start and end, docs/metadb.md), set as planview sets
a live job's.

The ``read_*`` and ``record_*`` functions block (metadb, compilation): call them in a
worker thread. Errors: the metadb's (``UnknownJobError`` for an unknown job), and
``REBUILD_ERRORS`` for a record this version cannot compile again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triplane import metadb as mdb
from triplane.metadb.jobs import job_plan
from triplane.metadb.tasks import kernel_times
from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.compile import ClusterSnapshot, compile_job
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.explain import with_actual as set_actual
from triplane.scheduler.compiler.jobplan import JobPlan
from triplane.scheduler.compiler.layout import figures_from_json, lay_out
from triplane.scheduler.compiler.pipeline import PlanCache
from triplane.scheduler.compiler.planview import plan_document

__all__ = ["BINDINGS", "REBUILD_ERRORS", "RELEASED", "EarlierJob", "EarlierJobs", "placed_now", "plan_again",
           "read_recorded_plan", "read_released", "record_released", "recorded_document", "with_actual"]

BINDINGS = "job.bindings"
RELEASED = "job.released"
# What compiling a stored job again raises when its record is not one this version
# accepted (a graph it rejects, bindings with missing or mistyped fields).
REBUILD_ERRORS = (GraphError, KeyError, TypeError, IndexError, ValueError)


@dataclass
class EarlierJob:
    """A job of the metadb that this process did not run. For a done job, ``plan`` is its
    plan compiled again and ``holders`` maps each done task to the node holding its tile."""

    job: str
    state: str  # the metadb's job state
    fetch: tuple[str, ...]  # the submitted names a client may read
    plan: JobPlan | None = None
    holders: dict[str, str] = field(default_factory=dict)


def read_job(db: mdb.MetaDB, job: str, plans: PlanCache) -> EarlierJob:
    """The job as recorded; a done one compiled again (blocking)."""
    with db.read() as s:
        info = mdb.get_job(s, job)
        if info.state != "done":
            return EarlierJob(job, info.state, info.fetch)
        graph = Graph.from_json(mdb.get_graph(s, info.graph_hash).canonical)
        ev = mdb.list_events(s, job, limit=1, kind=BINDINGS)
        holders = {t.task_id: t.node for t in mdb.list_tasks(s, job, states=["done"]) if t.node}
    if not ev:
        raise KeyError(f"job {job} has no {BINDINGS} event")
    return EarlierJob(job, info.state, info.fetch, plan_again(job, graph, ev[0].payload, plans), holders)


def plan_again(job: str, graph: Graph, bindings: Mapping[str, Any], plans: PlanCache) -> JobPlan:
    """A stored job's plan compiled again from its graph and ``job.bindings`` payload.
    A tiled job is laid out for the figures it was submitted with, so its task ids name
    the same tiles as its task rows. ``REBUILD_ERRORS`` for a record this version cannot
    compile. A job recorded as grouped (``"grouped": true``) is grouped again; any other
    (older records too) runs one task per node, as it did; one recorded ``"whole"`` (bigger
    than a tiny job, kept whole for its cluster) is grouped again whatever its size."""
    figs = figures_from_json(bindings["figures"]) if "figures" in bindings else ()
    held = bindings.get("held")  # the tile boundaries of tiled refs it was laid out knowing
    # Not recorded as kept whole: it was laid out cut (or was small enough not to be), so it
    # is laid out again with keeping whole off, whatever the scheduler's --whole-s now is.
    snap = ClusterSnapshot(tuple(figs), held=(lambda _: held) if isinstance(held, dict) else None,
                           whole_s=0)
    return compile_job(graph, bindings["fetch"], snap, cache=plans, job=job,
                       args=bindings["args"], group=bool(bindings.get("grouped")),
                       whole=bool(bindings.get("whole")))


def read_released(db: mdb.MetaDB, job: str) -> bool:
    """Whether the job's tensors were released (a ``job.released`` event)."""
    with db.read() as s:
        return bool(mdb.list_events(s, job, limit=1, kind=RELEASED))


def record_released(db: mdb.MetaDB, job: str) -> None:
    """Record that the job's tensors were released (blocking; idempotent in effect)."""
    with db.transaction() as s:
        mdb.add_events(s, [mdb.NewEvent(job, RELEASED, at=time.time())])


def read_recorded_plan(db: mdb.MetaDB, job: str) -> tuple[mdb.JobInfo, Any | None,
                                                           dict[str, tuple[float, float]]]:
    """(the job, the explain JSON recorded at submit with this job's actual times set
    :func:`with_actual` from its task rows -- or None if no plan was recorded -- and those
    times: task -> kernel start, end)."""
    with db.read() as s:
        info = mdb.get_job(s, job)
        plan = job_plan(s, job)
        times = kernel_times(s, job)
    return info, None if plan is None else with_actual(plan.plan, times), times


def with_actual(doc: Mapping[str, Any], actual: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """A stored plan document with the actual times its task rows hold (``actual``: task ->
    kernel start, end), as planview sets a live job's (explain's :func:`~triplane.scheduler.
    compiler.explain.with_actual`; the makespan's once every task has a time), and
    ``tasks_run``."""
    tasks = doc.get("tasks") or []
    return {**set_actual(doc, actual), "tasks_run": sum(1 for t in tasks if t.get("task") in actual)}


def recorded_document(job: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The body of ``GET /v1/jobs/{id}/plan`` from a recorded plan (as
    :func:`read_recorded_plan` returns it: explain's JSON stored at submit, with this job's
    actual times): jobs of one graph on one cluster share the record, so ``job`` is set to
    this one; ``recorded: true``."""
    return {**doc, "job": job, "recorded": True}


def placed_now(job: str, plan: JobPlan, figures: Sequence[NodeFigures],
               actual: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """The plan document of a job too small to have been placed at submit, placed now for
    ``figures`` (``followed: false``, ``recorded: false``; CPU work: call in a thread),
    with the kernel times ``actual`` (task -> start, end) its task rows hold beside the
    predictions. Tasks are labelled with the fetched names where they have one, else
    canonical ids."""
    back = {nid: name for name, nid in plan.fetch.items()}
    doc = plan_document(job, lay_out(plan.plan.graph, figures), back, {}, complete=False)
    return with_actual({**doc, "recorded": False}, actual or {})


class EarlierJobs:
    """Done jobs an earlier process ran, compiled again on their first fetch; the ``size``
    last used are kept (LRU), so reading a job's tensors one after another compiles once.
    Concurrent first fetches of one job share one compilation."""

    def __init__(self, db: mdb.MetaDB, plans: PlanCache, size: int = 16) -> None:
        self.db = db
        self.plans = plans
        self.size = size
        self._views: OrderedDict[str, EarlierJob] = OrderedDict()
        self._loading: dict[str, asyncio.Future[EarlierJob]] = {}
        self.loads = 0  # jobs read and compiled (for tests)

    async def get(self, job: str) -> EarlierJob:
        """The job's view (metadb read and compilation in a worker thread)."""
        view = self._views.get(job)
        if view is not None:
            self._views.move_to_end(job)
            return view
        fut = self._loading.get(job)
        if fut is None:
            self.loads += 1
            fut = asyncio.ensure_future(asyncio.to_thread(read_job, self.db, job, self.plans))
            self._loading[job] = fut
            fut.add_done_callback(lambda f: self._loaded(job, f))
        return await asyncio.shield(fut)

    def _loaded(self, job: str, fut: asyncio.Future[EarlierJob]) -> None:
        self._loading.pop(job, None)
        if fut.cancelled() or fut.exception() is not None:
            return
        view = fut.result()
        if view.state == "done":  # other states may still change (a resumed job ends)
            self._views[job] = view
            while len(self._views) > self.size:
                self._views.popitem(last=False)

    def forget(self, job: str) -> None:
        """Drop the job's view (its holders change: lineage.py ran its lost tiles again)."""
        self._views.pop(job, None)

    def __len__(self) -> int:
        return len(self._views)
