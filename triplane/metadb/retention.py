"""Retention: deleting the rows of finished jobs nobody can read any more.

Every job leaves a job row, its task rows, its tile rows and its events. A training loop
submits a job per step, so without a bound the metadb grows by every step's rows forever.
:func:`prune_jobs` deletes the rows of *releasable* jobs beyond a bound, the way Ray, Dask
or a Kubernetes ``ttlSecondsAfterFinished`` forget finished jobs:

* releasable: a terminal job (done, failed, cancelled) whose tensors were released (a
  ``job.released`` event: ``DELETE /v1/jobs/{id}`` or a session's end), or a failed or
  cancelled one holding no ``present`` tile. A done job that was not released is kept
  whatever its age: its tiles are still readable, and a restarted scheduler rebuilds it
  from these rows. Running and queued jobs are never touched.
* beyond the bound: all releasable jobs but the newest ``keep`` (by ``created_at``), and,
  with ``older_than`` (a Unix time), those whose row was last updated before it.

The graphs and recorded plans of deleted jobs go too once no job left refers to them
(jobs of one graph share them: a training loop's steps keep one).
Deleted pages are reused by SQLite and PostgreSQL alike, so the database stops growing
without a ``VACUUM``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from triplane.metadb.db import MetaDB
from triplane.metadb.errors import InvalidInputError
from triplane.metadb.models import Event, Graph, Job, JobTag, Plan, Task, Tile

__all__ = ["RELEASED", "delete_jobs", "prune", "prune_jobs", "releasable_jobs"]

RELEASED = "job.released"  # the event kind a release records (scheduler/earlier.py)
CHUNK = 500  # ids per DELETE ... IN (...): under SQLite's parameter limit


def _releasable() -> sa.ColumnElement[bool]:
    released = sa.exists().where(Event.job_id == Job.id, Event.kind == RELEASED)
    holding = sa.exists().where(Tile.job_id == Job.id, Tile.state == "present")
    return sa.and_(
        Job.state.in_(("done", "failed", "cancelled")),
        sa.or_(released, sa.and_(Job.state.in_(("failed", "cancelled")), ~holding)),
    )


def releasable_jobs(session: Session, *, keep: int, older_than: float | None = None,
                    settled_before: float | None = None, limit: int = CHUNK) -> list[str]:
    """Up to ``limit`` ids of releasable jobs beyond the bound (see the module doc); with
    ``settled_before`` (a Unix time), only jobs whose row was last updated before it (the
    scheduler leaves a grace period so that no write of a job's end is still queued)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise InvalidInputError(f"keep must be an integer >= 0, got {keep!r}")
    if limit < 1:
        raise InvalidInputError(f"limit must be >= 1, got {limit!r}")
    beyond = (sa.select(Job.id, Job.updated_at).where(_releasable())
              .order_by(Job.created_at.desc(), Job.id.desc()).offset(keep).subquery())
    pick = sa.select(beyond.c.id)
    if settled_before is not None:  # the newest N count every job; only settled ones go
        pick = pick.where(beyond.c.updated_at < settled_before)
    ids = list(session.scalars(pick.limit(limit)))
    if older_than is not None and len(ids) < limit:
        kept = set(ids)
        stale = (sa.select(Job.id).where(_releasable(), Job.updated_at < older_than)
                 .order_by(Job.created_at, Job.id).limit(limit))
        ids += [j for j in session.scalars(stale) if j not in kept][: limit - len(ids)]
    return ids


def prune(db: MetaDB, *, keep: int, older_than: float | None = None,
          settled_before: float | None = None) -> list[str]:
    """:func:`prune_jobs` until no backlog is left, one short transaction per ``CHUNK``
    jobs (blocking: call it in a worker thread); the ids deleted."""
    gone: list[str] = []
    while True:
        with db.transaction() as s:
            ids = releasable_jobs(s, keep=keep, older_than=older_than, settled_before=settled_before)
            delete_jobs(s, ids)
        gone += ids
        if len(ids) < CHUNK:
            return gone


def delete_jobs(session: Session, ids: Sequence[str]) -> int:
    """Delete the rows of ``ids`` (events, tiles, tasks, the job row), then the plans and
    graphs of theirs that no job left refers to; how many job rows went. The caller picks
    the ids (:func:`releasable_jobs`): nothing is checked here. A job stored meanwhile
    with one of those graphs stores it again (``put_graph``); on PostgreSQL one that
    commits during the delete fails this transaction on the foreign key, never the job."""
    gone = 0
    for i in range(0, len(ids), CHUNK):
        chunk = list(ids[i:i + CHUNK])
        graphs = set(session.scalars(sa.select(Job.graph_hash).where(Job.id.in_(chunk))))
        for model in (Event, Tile, Task, JobTag):
            session.execute(sa.delete(model).where(model.job_id.in_(chunk)))
        gone += session.execute(sa.delete(Job).where(Job.id.in_(chunk))).rowcount or 0
        used_plans = sa.select(Job.plan_id).where(Job.plan_id.is_not(None))
        session.execute(sa.delete(Plan).where(Plan.graph_hash.in_(graphs), Plan.id.not_in(used_plans)))
        session.execute(sa.delete(Graph).where(
            Graph.hash.in_(graphs), Graph.hash.not_in(sa.select(Job.graph_hash)),
            Graph.hash.not_in(sa.select(Plan.graph_hash))))
    return gone


def prune_jobs(session: Session, *, keep: int, older_than: float | None = None,
               settled_before: float | None = None, limit: int = CHUNK) -> int:
    """Delete the rows of up to ``limit`` releasable jobs beyond the bound (one
    transaction: the caller's); how many jobs went. Call it again while it returns
    ``limit`` to catch up on a backlog in short transactions."""
    return delete_jobs(session, releasable_jobs(session, keep=keep, older_than=older_than,
                                                settled_before=settled_before, limit=limit))
