"""The REST routes of docs/runtime.md over a :class:`~triplane.scheduler.service.Scheduler`.

``create_app(scheduler, token)`` builds the FastAPI app; uvicorn serves it on the same
event loop as the dispatcher (``triplane.scheduler.cli``). Bodies are read with a size
bound before anything parses them (413 past ``max_graph_bytes`` / ``max_upload_bytes``);
a job request is parsed as strict JSON (no duplicate keys) and its ids and ranks checked
(``triplane.proto.validate.check_submission``) before ``Graph.from_dict`` and the op
table's validation (400 naming the node and op). Who may call which route is ``auth.py``'s
table (``ROUTE_ROLES``, read by the one ``auth.route`` dependency every route takes), and a
submit token's job, upload and session routes check that the job, upload or session is its
own. The admin routes (nodes, jobs pages, tasks, tiles, tokens, health and readiness) are
``admin.py``'s; ``/openapi.json`` describes every route and answer (``models.py``) and
``/docs`` shows it. With an in-memory registry, the registry API of
``triplane.registry.http`` is mounted under ``/v1/registry``: it takes the node credential
only (a client token is 403).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, BackgroundTasks, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from triplane import metadb as mdb
from triplane.proto.errors import GraphError
from triplane.proto.limits import MAX_RANK
from triplane.proto.validate import loads_json
from triplane.registry import MemoryBackend
from triplane.registry.credential import node_credential
from triplane.scheduler.api import errors
from triplane.scheduler.api import models as m
from triplane.scheduler.api.admin import install_admin
from triplane.scheduler.api.auth import Authenticator, Principal
from triplane.scheduler.api.bound import BoundRequest
from triplane.scheduler.api.events import events_router
from triplane.scheduler.api.jobrequest import parse_job_request
from triplane.scheduler.api.static import install_static
from triplane.scheduler.api.views import install_views
from triplane.scheduler.compiler.jobplan import is_tensor_id
from triplane.scheduler.errors import BadRequest, Forbidden, NotFound, TooLarge
from triplane.scheduler.refs import MAX_COPY, parse_ref, refs_in_args, refs_in_graph
from triplane.scheduler.service import VERSION, Scheduler
from triplane.scheduler.sessions import Lease
from triplane.scheduler.store import UploadError, expected_bytes, parse_dtype, parse_shape

log = logging.getLogger(__name__)

MAX_GRAPH_BYTES = 32 * 1024 * 1024
MAX_WAIT_S = 60.0
_NOT_STORED = object()


async def read_body(request: Request, limit: int, what: str) -> bytearray:
    """The request body, refusing (413) anything over ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"{what} of {int(declared)} bytes is over the limit of {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise TooLarge(f"{what} is over the limit of {limit} bytes")
    return body


def parse_copy_request(body: bytes | bytearray) -> list[str]:
    """The refs of a ``POST /v1/tensors/copy`` body ``{"from": [ref, ...]}`` (at most
    ``MAX_COPY``); BadRequest naming a malformed field or element."""
    try:
        doc = loads_json(body)
    except (GraphError, ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not strict JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) != {"from"}:
        raise BadRequest('expected {"from": [ref, ...]}')
    refs = doc["from"]
    if not isinstance(refs, list) or len(refs) > MAX_COPY:
        raise BadRequest(f"'from' must be a list of at most {MAX_COPY} refs (<job>:<name>)")
    for i, ref in enumerate(refs):
        if parse_ref(ref) is None:
            raise BadRequest(f"from[{i}] = {str(ref)[:60]!r} is not a ref (<job>:<fetched name>)")
    return refs


class Owners:
    """Job id -> the name of the token that submitted it, read from the metadb (and kept in a
    small LRU: an owner never changes). ``_NOT_STORED`` for a job the metadb does not hold."""

    def __init__(self, db: mdb.MetaDB, size: int = 4096) -> None:
        self.db = db
        self.size = size
        self._cache: OrderedDict[str, str | None] = OrderedDict()

    def get(self, job: str) -> object:
        if job in self._cache:
            self._cache.move_to_end(job)
            return self._cache[job]
        try:
            with self.db.read() as s:
                owner = mdb.get_job(s, job).owner
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            return _NOT_STORED
        self._cache[job] = owner
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return owner

    def remember(self, job: str, owner: str | None) -> None:
        """A job submitted here: its owner known without a read (the next step releases it)."""
        self._cache[job] = owner
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)

    def check(self, p: Principal, job: str) -> None:
        """403 unless ``p`` may see ``job``: admin and read see every job, a submit token only
        its own. An unknown job passes, so that the route answers its 404."""
        if p.sees_all_jobs:
            return
        owner = self.get(job)
        if owner is not _NOT_STORED and owner != p.name:
            raise Forbidden(f"job {job} is not one of the jobs of {p.name!r}; "
                                             "a submit token sees and cancels only its own jobs")


def create_app(
    scheduler: Scheduler,
    token: str | bytes,
    *,
    max_graph_bytes: int = MAX_GRAPH_BYTES,
    max_upload_bytes: int | None = None,
    tokens_file: Path | None = None,
) -> FastAPI:
    """The scheduler's FastAPI app. Every route but health, readiness and the API's own
    description (``/openapi.json``, ``/docs``) needs a bearer token:
    ``token`` (the admin token), a token listed in ``tokens_file`` (``tokens.py``) or, for
    the served registry alone, the node credential derived from the scheduler's secret."""
    upload_limit = max_upload_bytes if max_upload_bytes is not None else scheduler.store.max_bytes
    auth = Authenticator(token, tokens_file=tokens_file, node_credential=node_credential(scheduler.secret))
    owners = Owners(scheduler.db)
    anyone = changer = Depends(auth.route)  # who may call which route: auth.ROUTE_ROLES
    app = FastAPI(title="triplane scheduler", version=VERSION, redoc_url=None,
                  description="The REST API of a triplane scheduler (docs/api.md).")
    errors.install(app)
    app.state.auth = auth
    api = APIRouter(prefix="/v1", responses=m.ERRORS)

    def session_of(request: Request, p: Principal) -> Lease | None:
        """The caller's session named by ``X-Triplane-Session`` (renewed), if any: 404 when
        unknown or expired, 403 when another token's."""
        sid = request.headers.get("x-triplane-session")
        if not sid:
            return None
        return scheduler.sessions.renew(sid, p.name, admin=p.role == "admin")

    def check_upload_owner(p: Principal, upload: str) -> None:
        """403 unless ``p`` may delete ``upload``: admin, or the token that uploaded it. An
        unknown upload passes (the route answers its 404, a carried release skips it)."""
        t = scheduler.store.get(upload)
        if t is not None and p.role != "admin" and t.owner != p.name:
            raise Forbidden(f"upload {upload} is not one of {p.name!r}'s; a submit token releases "
                            "only its own uploads")

    @app.get("/v1/health", response_model=m.Health, tags=["health"])
    async def health() -> dict[str, Any]:
        return {"ok": True, "role": scheduler.role, "version": VERSION}

    @api.get("/whoami", response_model=m.Whoami)
    async def whoami(p: Principal = anyone) -> dict[str, Any]:
        return {"name": p.name, "role": p.role}

    @api.post("/tensors", status_code=201, response_model=m.Upload, tags=["tensors"],
              openapi_extra=m.UPLOAD_BODY)
    async def upload(request: Request, p: Principal = changer) -> dict[str, Any]:
        try:
            shape = parse_shape(request.headers.get("x-triplane-shape", ""))
            dtype = parse_dtype(request.headers.get("x-triplane-dtype", ""))
        except UploadError as e:
            raise BadRequest(str(e)) from None
        if len(shape) > MAX_RANK:
            raise BadRequest(f"X-Triplane-Shape has {len(shape)} dimensions, more than the limit of "
                             f"{MAX_RANK}", kind="limit")
        if expected_bytes(shape, dtype) > upload_limit:
            raise TooLarge(f"a {dtype}{list(shape)} tensor is over the upload limit of {upload_limit} bytes",
            )
        lease = session_of(request, p)
        body = await read_body(request, upload_limit, "upload")
        try:
            stored = scheduler.upload(body, shape, dtype, owner=p.name)
        except UploadError as e:
            raise BadRequest(str(e)) from None
        if lease is not None:
            scheduler.sessions.tag_upload(lease, stored.id)
        return stored.as_dict()

    @api.post("/tensors/copy", status_code=201, response_model=m.CopyResult, tags=["tensors"],
              openapi_extra=m.body_of(m.CopyRequest))
    async def copy_tensors(request: Request, p: Principal = changer) -> dict[str, Any]:
        """Copies of refs' values as uploads of the caller (checkpoints: ``scheduler/refs.py``)."""
        refs = parse_copy_request(await read_body(request, 1 << 20, "copy request"))
        for ref in refs:  # whoever may fetch a tensor may copy it
            owners.check(p, ref.partition(":")[0])
        lease = session_of(request, p)
        ids = await scheduler.copy(refs, owner=p.name)
        if lease is not None:
            for upload in ids:
                scheduler.sessions.tag_upload(lease, upload)
        return {"ids": ids}

    @api.delete("/tensors/{upload}", response_model=m.Released, tags=["tensors"])
    async def release_upload(upload: str, p: Principal = changer) -> dict[str, Any]:
        if scheduler.store.get(upload) is None:
            raise NotFound(f"unknown upload {upload[:40]!r} (released already?)")
        check_upload_owner(p, upload)
        await scheduler.release_upload(upload)
        return {"id": upload, "released": True}

    @api.post("/sessions", status_code=201, response_model=m.SessionBody, tags=["sessions"])
    async def open_session(p: Principal = changer) -> dict[str, Any]:
        lease = scheduler.sessions.open(p.name)
        return {"id": lease.id, "ttl_s": scheduler.sessions.ttl_s}

    @api.post("/sessions/{sid}/renew", response_model=m.SessionBody, tags=["sessions"])
    async def renew_session(sid: str, p: Principal = changer) -> dict[str, Any]:
        lease = scheduler.sessions.renew(sid, p.name, admin=p.role == "admin")
        return {"id": lease.id, "ttl_s": scheduler.sessions.ttl_s}

    @api.delete("/sessions/{sid}", response_model=m.SessionEnded, tags=["sessions"])
    async def end_session(sid: str, p: Principal = changer) -> dict[str, Any]:
        scheduler.sessions.get(sid, p.name, admin=p.role == "admin")
        held = await scheduler.end_session(sid)
        return {"id": sid, "uploads": len(held.uploads), "jobs": len(held.jobs)}

    @api.post("/jobs", status_code=201, response_model=m.SubmitAnswer, response_model_exclude_unset=True,
              tags=["jobs"], openapi_extra=m.body_of(m.JobRequestBody))
    async def submit(request: Request, background: BackgroundTasks, p: Principal = changer) -> dict[str, Any]:
        body = await read_body(request, max_graph_bytes, "job request")
        if len(body) > 65536:
            parsed, waiting, release = await asyncio.to_thread(parse_job_request, body)
        else:
            parsed, waiting, release = parse_job_request(body)
        lease = session_of(request, p)
        for ident in release:  # as the DELETEs check, before anything is submitted
            if is_tensor_id(ident):
                check_upload_owner(p, ident)
            else:
                owners.check(p, ident)
        if release:  # once the answer is sent: off this request's path (api/waiting.py)
            background.add_task(scheduler.release_many, release)
        # whoever may fetch a tensor may use it as a ref (a submit token: its own jobs')
        named = ([*refs_in_args(parsed.args), *parsed.inline_refs] if isinstance(parsed, BoundRequest)
                 else refs_in_graph(parsed.graph))
        for ref in named:
            owners.check(p, ref.partition(":")[0])
        if isinstance(parsed, BoundRequest):  # a compiled step: new inputs for a known plan
            body_out = await scheduler.submit_bound(*parsed, owner=p.name)
            owners.remember(body_out["id"], p.name)
            if lease is not None:
                scheduler.sessions.tag_job(lease, body_out["id"])
            answer = {"id": body_out["id"], "state": body_out["state"]}
            if "ref_values" in body_out:
                answer["ref_values"] = body_out["ref_values"]
        else:
            body_out = await scheduler.submit(parsed.graph, parsed.fetch, parsed.deadline_s, owner=p.name,
                                              grad=parsed.grad, persist=parsed.persist, name=parsed.name,
                                              tags=parsed.tags, prefer=parsed.prefer)
            if lease is not None:
                scheduler.sessions.tag_job(lease, body_out["id"])
            answer = {"id": body_out["id"], "state": body_out["state"], "plan": body_out["plan"],
                      "args": body_out["args"]}
        if waiting is None:
            return answer
        return await scheduler.waited(answer, waiting.wait_s, waiting.inline)

    @api.get("/jobs/{job}/wait", response_model=m.JobStatus, tags=["jobs"])
    async def job_wait(job: str, timeout: float = 30.0, p: Principal = anyone) -> dict[str, Any]:
        if not 0 <= timeout <= 3600:
            raise BadRequest("timeout must be in 0..3600 seconds")
        owners.check(p, job)
        return await scheduler.wait(job, min(timeout, MAX_WAIT_S))

    @api.get("/jobs/{job}/tensors/{name}", response_class=StreamingResponse, tags=["jobs"], responses={
        200: {"content": {"application/octet-stream": {}},
              "description": "the raw little-endian C-order bytes (shape and dtype in X-Triplane-Shape "
                             "and X-Triplane-Dtype)"}})
    async def tensor(job: str, name: str, p: Principal = anyone) -> StreamingResponse:
        owners.check(p, job)
        shape, dtype, nbytes, chunks = await scheduler.open_tensor(job, name)
        return StreamingResponse(
            chunks,
            media_type="application/octet-stream",
            headers={
                "X-Triplane-Shape": ",".join(str(s) for s in shape),
                "X-Triplane-Dtype": dtype,
                "Content-Length": str(nbytes),
            },
        )

    @api.get("/jobs/{job}/plan", response_model=dict[str, Any], tags=["jobs"])
    async def job_plan(job: str, p: Principal = anyone) -> dict[str, Any]:
        owners.check(p, job)
        return await scheduler.plan(job)

    @api.delete("/jobs/{job}", response_model=m.JobStatus, tags=["jobs"])
    async def cancel(job: str, p: Principal = changer) -> dict[str, Any]:
        owners.check(p, job)
        return await scheduler.release_job(job)

    @api.get("/stats", response_model=m.Stats)
    async def stats(p: Principal = anyone) -> JSONResponse:
        s = scheduler.shell.stats
        return JSONResponse(
            {
                "sent": s.sent,
                "resent": s.resent,
                "replies": s.replies,
                "acks": s.acks,
                "unsendable": s.unsendable,
                "stale_replies": s.stale_replies,
                "drops": s.drops.as_dict(),
                "plan_cache": {"hits": scheduler.plans.hits, "misses": scheduler.plans.misses},
            }
        )

    app.include_router(api)
    install_admin(app, scheduler, auth, owners, tokens_file=tokens_file, max_graph_bytes=max_graph_bytes)
    app.include_router(events_router(scheduler, auth, owners.check))
    install_views(app, scheduler, auth, owners)
    install_static(app)
    if isinstance(scheduler.registry, MemoryBackend):
        _mount_registry(app, scheduler.registry, auth, node_credential(scheduler.secret))
    return app


def _mount_registry(app: FastAPI, backend: MemoryBackend, auth: Authenticator, credential: str) -> None:
    try:
        from triplane.registry.http import registry_router
    except ImportError:
        log.warning("triplane.registry.http is not available: the in-memory registry is not served")
        return
    app.include_router(registry_router(backend, credential, is_client_token=auth.is_client_token))
