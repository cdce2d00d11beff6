"""The admin routes of the REST API (docs/api.md): health and readiness at the conventional
paths, nodes (page, detail, drain, undrain), engines, jobs (page with filters, detail,
cancel, retry, tasks, tiles), the cluster configuration and the client tokens.

Who may call each route is ``auth.ROUTE_ROLES``; list routes answer pages (``pages.py``);
the work is ``triplane.scheduler.admin.Admin``'s. Every route names its response model
(``models.py``) and the error answers (``models.ERRORS``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

import sqlalchemy as sa
from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.responses import JSONResponse

from triplane import metadb as mdb
from triplane.metadb import validate as v
from triplane.scheduler.admin import Admin
from triplane.scheduler.api import models as m
from triplane.scheduler.api.auth import Authenticator, Principal
from triplane.scheduler.api.pages import DEFAULT_LIMIT, check_limit, decode_cursor, page
from triplane.scheduler.api.tokens import add_token, read_tokens, remove_token
from triplane.scheduler.errors import BadRequest, Conflict, Forbidden, NotFound
from triplane.scheduler.service import VERSION, Scheduler

__all__ = ["JOB_STATES", "install_admin", "pop_labels"]

JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
READY_TIMEOUT_S = 2.0
Limit = Query(DEFAULT_LIMIT, ge=1, le=1000, description="items per page (1..1000)")
Cursor = Query(None, max_length=1024, description="the 'next' of the previous page")
States = Annotated[Sequence[str], Query(description=f"any of {list(JOB_STATES)} (repeatable)")]
Tags = Annotated[Sequence[str], Query(description="jobs with every one of these tags (repeatable)")]
Label = Annotated[str | None, Query(max_length=128)]
Since = Annotated[float | None, Query(description="created at or after (unix seconds)")]
Until = Annotated[float | None, Query(description="created before (unix seconds)")]


class OwnerCheck(Protocol):
    def check(self, p: Principal, job: str) -> None: ...


def install_admin(app: FastAPI, scheduler: Scheduler, auth: Authenticator, owners: OwnerCheck, *,
                  tokens_file: Path | None, max_graph_bytes: int) -> None:
    """Add the routes of this module to ``app`` (``scheduler.admin`` does the work)."""
    admin: Admin = scheduler.admin
    who = Depends(auth.route)
    api = APIRouter(prefix="/v1", responses=m.ERRORS)

    @app.get("/health", response_model=m.Health, tags=["health"])
    async def health() -> dict[str, Any]:
        """Liveness: the process answers (no credential; the same as ``/v1/health``)."""
        return {"ok": True, "role": scheduler.role, "version": VERSION}

    @app.get("/ready", response_model=m.Ready, tags=["health"], responses={503: {"model": m.Ready}})
    async def ready() -> Any:
        """Readiness: 200 when this scheduler leads and its metadata DB answers, else 503."""
        def ping() -> None:
            with scheduler.db.read() as s:
                s.execute(sa.text("SELECT 1"))

        metadb = False
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.to_thread(ping), READY_TIMEOUT_S)
            metadb = True
        ok = metadb and scheduler.role == "leader"
        body = {"ready": ok, "role": scheduler.role, "metadb": metadb, "version": VERSION}
        return body if ok else JSONResponse(body, status_code=503)

    # --- nodes and engines -------------------------------------------------------------------

    @api.get("/nodes", response_model=m.NodePage, tags=["nodes"])
    async def nodes(limit: int = Limit, cursor: str | None = Cursor, p: Principal = who) -> dict[str, Any]:
        """The registered executors by name: address, running tasks, memory, calibration, drain."""
        after = decode_cursor(cursor, (str,))
        items = [n for n in await scheduler.nodes() if after is None or n["node"] > after[0]]
        return page(sorted(items, key=lambda n: n["node"])[:limit + 1], limit, lambda n: [n["node"]])

    @api.get("/nodes/{node}", response_model=m.Node, tags=["nodes"])
    async def node(node: str, p: Principal = who) -> dict[str, Any]:
        return await admin.node(node)

    @api.post("/nodes/{node}/drain", response_model=m.Node, tags=["nodes"])
    async def drain(node: str, p: Principal = who) -> dict[str, Any]:
        """No new tasks go to the node (placement and drift skip it); running ones finish.
        Kept in the registry: every scheduler replica sees it, and it outlives restarts."""
        return await admin.drain(node, True, p.name)

    @api.post("/nodes/{node}/undrain", response_model=m.Node, tags=["nodes"])
    async def undrain(node: str, p: Principal = who) -> dict[str, Any]:
        return await admin.drain(node, False, p.name)

    @api.get("/engines", response_model=m.EnginePage, tags=["nodes"])
    async def engines(limit: int = Limit, cursor: str | None = Cursor, p: Principal = who) -> dict[str, Any]:
        """The registered op engines by (node, engine), each with the memory engine it is bound to."""
        after = decode_cursor(cursor, (str, str))
        items = [e for e in await scheduler.engines()
                 if after is None or (e["node"], e["engine"]) > (after[0], after[1])]
        return page(items[:limit + 1], limit, lambda e: [e["node"], e["engine"]])

    # --- jobs --------------------------------------------------------------------------------

    @api.get("/jobs", response_model=m.JobPage, tags=["jobs"])
    async def jobs(limit: int = Limit, cursor: str | None = Cursor, state: States = (),
                   owner: Label = None, name: Label = None, tag: Tags = (), since: Since = None,
                   until: Until = None, p: Principal = who) -> dict[str, Any]:
        """Jobs, newest first; a submit token sees only its own."""
        check_limit(limit)
        bad = [s for s in state if s not in JOB_STATES]
        if bad:
            raise BadRequest(f"unknown state(s) {bad} (known: {list(JOB_STATES)})")
        if len(tag) > 16 or any(not 0 < len(t) <= 64 for t in tag) or name == "":
            raise BadRequest("tag: at most 16 tags of 1..64 characters; name: 1..128 characters")
        if not p.sees_all_jobs:
            if owner is not None and owner != p.name:
                raise Forbidden(f"a submit token ({p.name!r}) lists only its own jobs")
            owner = p.name
        key = decode_cursor(cursor, (float, str))
        items = await admin.jobs(limit=limit + 1, before=None if key is None else (key[0], key[1]),
                                 owner=owner, states=list(state) or None, name=name, tags=list(tag),
                                 since=since, until=until)
        return page(items, limit, lambda j: [j["created"], j["id"]])

    @api.get("/jobs/{job}", response_model=m.JobDetail, tags=["jobs"])
    async def job_status(job: str, p: Principal = who) -> dict[str, Any]:
        """A job's state, progress, error, owner, name and tags."""
        owners.check(p, job)
        return await asyncio.to_thread(admin.status, job)

    @api.post("/jobs/{job}/cancel", response_model=m.JobStatus, tags=["jobs"])
    async def cancel(job: str, p: Principal = who) -> dict[str, Any]:
        """Cancel a running job and release its results: the same as ``DELETE /v1/jobs/{job}``."""
        owners.check(p, job)
        return await scheduler.release_job(job)

    @api.post("/jobs/{job}/retry", response_model=m.Retried, status_code=201, tags=["jobs"])
    async def retry(job: str, p: Principal = who) -> dict[str, Any]:
        """A failed or cancelled job again, as a new job (same graph, fetch, inputs, owner, name, tags)."""
        owners.check(p, job)
        return await admin.retry(job)

    @api.get("/jobs/{job}/tasks", response_model=m.TaskPage, tags=["jobs"])
    async def tasks(job: str, limit: int = Limit, cursor: str | None = Cursor,
                    p: Principal = who) -> dict[str, Any]:
        """A job's tasks by id: state, attempt, node, times, error and drift history."""
        owners.check(p, job)
        key = decode_cursor(cursor, (str,))
        items = await admin.tasks(job, after=None if key is None else key[0], limit=check_limit(limit) + 1)
        return page(items, limit, lambda t: [t["id"]])

    @api.get("/jobs/{job}/tiles", response_model=m.TilePage, tags=["jobs"])
    async def tiles(job: str, limit: int = Limit, cursor: str | None = Cursor,
                    p: Principal = who) -> dict[str, Any]:
        """Where a job's results live: tensor, tile index, shape, dtype, node, memory engine, bytes."""
        owners.check(p, job)
        key = decode_cursor(cursor, (str, str))
        items = await admin.tiles(job, after=None if key is None else (key[0], key[1]),
                                  limit=check_limit(limit) + 1)
        return page(items, limit, lambda t: [t["plan_node"], mdb.index_key(t["index"])])

    # --- configuration and tokens --------------------------------------------------------------

    @api.get("/config", response_model=m.Config, tags=["cluster"])
    async def config(p: Principal = who) -> dict[str, Any]:
        """What this scheduler runs with (no secrets)."""
        return admin.config(max_graph_bytes=max_graph_bytes)

    def book() -> Path:
        if tokens_file is None:
            raise Conflict("this scheduler has no tokens file (start it with --tokens-file; "
                           "`triplane up` gives it one)")
        return tokens_file

    @api.get("/tokens", response_model=m.TokenPage, tags=["tokens"])
    async def tokens(limit: int = Limit, cursor: str | None = Cursor, p: Principal = who) -> dict[str, Any]:
        """The client tokens by name (never the tokens or their hashes)."""
        after = decode_cursor(cursor, (str,))
        entries = [] if tokens_file is None else await asyncio.to_thread(read_tokens, tokens_file)
        items = sorted(({"name": e.name, "role": e.role, "created": e.created} for e in entries
                        if after is None or e.name > after[0]), key=lambda e: e["name"])
        return page(items[:limit + 1], limit, lambda e: [e["name"]])

    @api.post("/tokens", response_model=m.TokenCreated, status_code=201, tags=["tokens"])
    async def create_token(body: m.TokenRequest, p: Principal = who) -> dict[str, Any]:
        """A new token ``{"name", "role"}``: the answer holds the token, shown this once."""
        doc = {"name": body.name, "role": body.role}
        path = book()
        try:
            entries = await asyncio.to_thread(read_tokens, path)
            if any(e.name == doc["name"] for e in entries):
                raise Conflict(f"a token named {doc['name']!r} exists already (revoke it first)")
            token = await asyncio.to_thread(add_token, path, doc["name"], doc["role"])
        except ValueError as e:
            raise BadRequest(str(e)) from None
        created = next(e.created for e in await asyncio.to_thread(read_tokens, path) if e.name == doc["name"])
        return {"name": doc["name"], "role": doc["role"], "created": created, "token": token}

    @api.delete("/tokens/{name}", response_model=m.TokenRevoked, tags=["tokens"])
    async def revoke_token(name: str, p: Principal = who) -> dict[str, Any]:
        """Revoke a token: it stops working at once."""
        try:
            gone = await asyncio.to_thread(remove_token, book(), name)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        if not gone:
            raise NotFound(f"no token named {name[:64]!r}")
        return {"name": name, "revoked": True}

    app.include_router(api)


def pop_labels(doc: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """Take a job request's optional ``name`` (a string of 1..128 characters) and ``tags``
    (a list of at most 16 strings of 1..64 characters) out of it; BadRequest naming the
    field when malformed."""
    name, tags = doc.pop("name", None), doc.pop("tags", None)
    try:
        return (None if name is None else v.check_label("name", name, v.MAX_NAME),
                () if tags is None else v.check_tags(tags))
    except mdb.InvalidInputError as e:
        raise BadRequest(str(e)) from None
