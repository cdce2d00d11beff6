"""A job's record in the metadb: the rows a submit stores (``store_job``: the job, its
tasks, its bindings and its predicted plan, in one transaction), the ``job.bindings``
payload a restarted scheduler compiles it again from (``bindings_of``), and a stored
job's API body (``stored_body``, in the API's state vocabulary ``API_STATE``)."""

from __future__ import annotations

import logging
from typing import Any

from triplane import metadb as mdb
from triplane.metadb.models import Job as JobRow
from triplane.proto.states import JobState
from triplane.scheduler.compiler.jobplan import JobPlan
from triplane.scheduler.compiler.layout import UNSPLIT_BYTES, bigger_than, figures_to_json, structure_hash
from triplane.scheduler.compiler.planview import plan_document
from triplane.scheduler.earlier import BINDINGS
from triplane.scheduler.errors import Unavailable

__all__ = ["API_STATE", "bindings_of", "store_failed", "store_job", "stored_body"]

log = logging.getLogger(__name__)

API_STATE = {  # metadb job state -> the API's (one vocabulary: triplane.proto.states)
    "submitted": JobState.QUEUED,
    "compiling": JobState.QUEUED,
    "running": JobState.RUNNING,
    "done": JobState.DONE,
    "failed": JobState.FAILED,
    "cancelled": JobState.CANCELLED,
}


def store_job(db: mdb.MetaDB, plan: JobPlan, fetch: list[str], bindings: dict[str, Any], now: float,
              owner: str | None = None) -> None:
    """Store the job, its tasks, its bindings and its recorded plan in one transaction
    (blocking: a worker thread). The canonical graph is stored (its hash and JSON are
    computed for the plan cache anyway); the bindings hold what else a restarted
    scheduler needs to compile it again."""
    cgraph = plan.graph
    assert cgraph is not None
    lay = plan.layout
    if lay is None or lay.placement is None:  # a small job (a compiled step): a few statements
        rows = small_job_rows(plan, fetch, bindings, now, owner)
        with db.transaction() as s:
            mdb.write_job_rows(s.connection(), rows)
        return
    tasks = _new_tasks(plan)
    events = [mdb.NewEvent(plan.job, BINDINGS, at=now, payload=bindings)]
    with db.transaction() as s:
        mdb.create_job(s, graph_hash=cgraph.hash(), graph_json=cgraph.to_json(), fetch=fetch,
                       owner=owner, job_id=plan.job, state="running", now=now,
                       node_count=len(cgraph.nodes))
        mdb.insert_tasks(s, plan.job, tasks)
        mdb.add_events(s, events)
        # The prediction on record, so the run's actual times can be set beside it.
        doc = plan_document(plan.job, lay, plan.back, {}, complete=False)
        info = mdb.upsert_plan(s, graph_hash=cgraph.hash(), plan=doc, now=now,
                               structure_hash=structure_hash(lay.figures),
                               predicted_makespan=lay.placement.makespan)
        row = s.get(JobRow, plan.job)
        if row is not None:
            row.plan_id = info.id


def is_small(plan: JobPlan) -> bool:
    """Is ``plan`` stored as a few rows (no placement recorded: :func:`small_job_rows`)?"""
    return plan.layout is None or plan.layout.placement is None


def small_job_rows(plan: JobPlan, fetch: list[str], bindings: dict[str, Any], now: float,
                   owner: str | None = None) -> mdb.JobRows:
    """The checked rows of a small job (its graph, job, tasks and bindings event), built
    without the database: stored by :func:`store_job`, or queued to the journal's batch
    writer (``Journal.new_job``)."""
    cgraph = plan.graph
    assert cgraph is not None
    events = [mdb.NewEvent(plan.job, BINDINGS, at=now, payload=bindings)]
    return mdb.job_rows(graph_hash=cgraph.hash(), graph_json=cgraph.to_json(), fetch=fetch,
                        tasks=_new_tasks(plan), events=events,
                        owner=owner, job_id=plan.job, state="running", now=now, node_count=len(cgraph.nodes))


def _new_tasks(plan: JobPlan) -> list[mdb.NewTask]:
    return [mdb.NewTask(t.id, t.op, "ready" if not t.deps else "pending", predicted_s=t.cost_s)
            for t in plan.specs]


def bindings_of(plan: JobPlan) -> dict[str, Any]:
    """The ``job.bindings`` payload: what compiling the stored graph again needs besides it
    (upload ids, fetched names, and the figures a tiled job was laid out for)."""
    bindings: dict[str, Any] = {"args": list(plan.args), "fetch": dict(plan.fetch)}
    if plan.layout is not None and plan.layout.tiled:
        bindings["figures"] = figures_to_json(plan.layout.figures)
    if plan.group:
        bindings["grouped"] = True  # compiled again the same way (earlier.plan_again)
        if plan.layout is not None and bigger_than(plan.plan.graph, UNSPLIT_BYTES):
            bindings["whole"] = True  # kept whole for its cluster (layout.stays_whole): grouped again
    return bindings


def stored_body(info: mdb.JobInfo, error: Any) -> dict[str, Any]:
    return {
        "id": info.id,
        "state": API_STATE[info.state],
        "progress": {"done": info.tasks_done, "total": info.tasks_total},
        "error": error,
        "created": info.created_at,
        "updated": info.updated_at,
    }


def store_failed(job: str, e: Exception) -> Unavailable:
    log.error("cannot store job %s: %s", job, e)
    return Unavailable(f"the metadata DB refused the job: {e}")
