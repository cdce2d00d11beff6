"""The dashboard's aggregate routes (docs/api.md, "Aggregates"): a job's task timeline per
node and time bucket, a job's graph cut to a readable size, and the tiles of every memory
engine. Who may call them is ``auth.ROUTE_ROLES`` (any client role; a submit token only its
own jobs'); the work is ``triplane.scheduler.views.Views``'s."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query

from triplane.scheduler.api import models as m
from triplane.scheduler.api.admin import OwnerCheck
from triplane.scheduler.api.auth import Authenticator, Principal
from triplane.scheduler.service import Scheduler
from triplane.scheduler.views import MAX_GRAPH_NODES, Views

__all__ = ["install_views"]

Seconds = Annotated[float | None, Query(ge=0, le=1e11, description="unix seconds (default: the job's first "
                                                                    "kernel start / last kernel end)")]


def install_views(app: FastAPI, scheduler: Scheduler, auth: Authenticator, owners: OwnerCheck) -> None:
    views = Views(scheduler)
    who = Depends(auth.route)
    api = APIRouter(prefix="/v1", responses=m.ERRORS)

    @api.get("/jobs/{job}/timeline", response_model=m.Timeline, tags=["jobs"])
    async def timeline(job: str, start: Seconds = None, end: Seconds = None,
                       buckets: Annotated[int, Query(ge=1, le=2000)] = 200,
                       tasks: Annotated[int, Query(ge=0, le=5000, description="list the tasks too when the "
                                                   "window holds at most this many")] = 0,
                       p: Principal = who) -> dict[str, Any]:
        """A job's tasks per node and time bucket of ``[start, end)`` (their kernel start),
        and, when the window holds at most ``tasks`` tasks, those tasks one by one."""
        owners.check(p, job)
        return await views.timeline(job, start=start, end=end, buckets=buckets, tasks=tasks)

    @api.get("/jobs/{job}/graph", response_model=m.GraphView, tags=["jobs"])
    async def graph(job: str, limit: Annotated[int, Query(ge=1, le=MAX_GRAPH_NODES)] = 300,
                    p: Principal = who) -> dict[str, Any]:
        """A job's graph: its first ``limit`` nodes with shapes, dtypes and fused steps, the
        op counts of all."""
        owners.check(p, job)
        return await views.graph(job, limit=limit)

    @api.get("/storage", response_model=m.Storage, tags=["cluster"])
    async def storage(p: Principal = who) -> dict[str, Any]:
        """Every memory engine's capacity and free bytes, and tiles and bytes per node,
        memory engine and tile state."""
        return await views.storage()

    app.include_router(api)
