"""Jobs an earlier scheduler process ran: their tensors and recorded plans, from the metadb.

A done job outlives the process that ran it: the executors keep its fetched tiles until
``DELETE /v1/jobs/{id}``, and the metadb keeps what names them -- the canonical graph,
the ``job.bindings`` event (upload ids, fetched names, and the figures a tiled job was
laid out for), and the task rows (a done task's row names the node holding its output
tile, docs/scheduler.md). Compiling the graph again with those figures gives the same
task ids and tile grids as the first time (``Scheduler._resume`` relies on the same), so
a restarted scheduler reads the tiles where they are, exactly as for a job it ran.

A release (``DELETE``) is recorded as a ``job.released`` event, so whichever process
answers next knows the tiles are gone. The prediction made at submit is the job's row in
the ``plans`` table (``jobs.plan_id``); the actual kernel times are not in the metadb (a
task row's times are the scheduler's dispatch and reply times, not the kernel's), so a
recorded plan carries predictions only.

The ``read_*`` and ``record_*`` functions block (metadb, compilation): call them in a
worker thread. Errors: the metadb's (``UnknownJobError`` for an unknown job), and
GraphError/KeyError/ValueError for a record this version cannot compile again.
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
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.pipeline import PlanCache
from triplane.scheduler.jobplan import JobPlan, plan_job
from triplane.scheduler.layout import figures_from_json, lay_out
from triplane.scheduler.planview import plan_document

__all__ = ["BINDINGS", "RELEASED", "EarlierJob", "EarlierJobs", "placed_now", "read_recorded_plan",
           "read_released", "record_released", "recorded_document"]

BINDINGS = "job.bindings"
RELEASED = "job.released"


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
    bindings: Mapping[str, Any] = ev[0].payload
    # A tiled job is laid out again for the figures it was submitted with: its task ids
    # then name the same tiles as its task rows.
    figs = figures_from_json(bindings["figures"]) if "figures" in bindings else None
    plan = plan_job(job, graph, bindings["args"], bindings["fetch"], {}, plans, figures=figs)
    return EarlierJob(job, info.state, info.fetch, plan, holders)


def read_released(db: mdb.MetaDB, job: str) -> bool:
    """Whether the job's tensors were released (a ``job.released`` event)."""
    with db.read() as s:
        return bool(mdb.list_events(s, job, limit=1, kind=RELEASED))


def record_released(db: mdb.MetaDB, job: str) -> None:
    """Record that the job's tensors were released (blocking; idempotent in effect)."""
    with db.transaction() as s:
        mdb.add_events(s, [mdb.NewEvent(job, RELEASED, at=time.time())])


def read_recorded_plan(db: mdb.MetaDB, job: str) -> tuple[mdb.JobInfo, Any | None]:
    """(the job, the explain JSON recorded at submit or None if none was)."""
    with db.read() as s:
        info = mdb.get_job(s, job)
        plan = job_plan(s, job)
    return info, None if plan is None else plan.plan


def recorded_document(job: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The body of ``GET /v1/jobs/{id}/plan`` from a recorded plan: explain's JSON as stored
    at submit (jobs of one graph on one cluster share the record: ``job`` is set to this
    one), ``recorded: true``, and no actual times (they are not in the metadb)."""
    return {**doc, "job": job, "recorded": True}


def placed_now(job: str, plan: JobPlan, figures: Sequence[NodeFigures]) -> dict[str, Any]:
    """The plan document of a job too small to have been placed at submit, placed now for
    ``figures`` (``followed: false``, ``recorded: false``; CPU work: call in a thread).
    Tasks are labelled with the fetched names where they have one, else canonical ids."""
    back = {nid: name for name, nid in plan.fetch.items()}
    doc = plan_document(job, lay_out(plan.plan.graph, figures), back, {}, complete=False)
    return {**doc, "recorded": False}


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

    def __len__(self) -> int:
        return len(self._views)
