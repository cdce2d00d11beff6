"""The REST routes of docs/runtime.md over a :class:`~triplane.scheduler.service.Scheduler`.

``create_app(scheduler, token)`` builds the FastAPI app; uvicorn serves it on the same
event loop as the dispatcher (``triplane.scheduler.cli``). Bodies are read with a size
bound before anything parses them (413 past ``max_graph_bytes`` / ``max_upload_bytes``);
graphs go through ``Graph.from_dict`` and the op table's validation (400 naming the node
and op). With an in-memory registry, the registry API of ``triplane.registry.http`` is
mounted under ``/v1/registry`` (guarded: the rest works without it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from triplane.registry import MemoryBackend
from triplane.scheduler.api import errors
from triplane.scheduler.api.auth import require_token
from triplane.scheduler.api.errors import ApiError
from triplane.scheduler.service import VERSION, Scheduler
from triplane.scheduler.store import UploadError, expected_bytes, parse_dtype, parse_shape

log = logging.getLogger(__name__)

MAX_GRAPH_BYTES = 32 * 1024 * 1024
MAX_WAIT_S = 60.0


async def read_body(request: Request, limit: int, what: str) -> bytearray:
    """The request body, refusing (413) anything over ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "too_large", f"{what} of {int(declared)} bytes is over the limit of {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "too_large", f"{what} is over the limit of {limit} bytes")
    return body


def create_app(
    scheduler: Scheduler,
    token: str | bytes,
    *,
    max_graph_bytes: int = MAX_GRAPH_BYTES,
    max_upload_bytes: int | None = None,
) -> FastAPI:
    """The scheduler's FastAPI app; every route but ``/v1/health`` needs the bearer ``token``."""
    token_b = token.encode() if isinstance(token, str) else token
    upload_limit = max_upload_bytes if max_upload_bytes is not None else scheduler.store.max_bytes
    app = FastAPI(
        title="triplane scheduler", version=VERSION, docs_url=None, redoc_url=None, openapi_url=None
    )
    errors.install(app)
    api = APIRouter(prefix="/v1", dependencies=[Depends(require_token(token_b))])

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "role": scheduler.role, "version": VERSION}

    @api.post("/tensors", status_code=201)
    async def upload(request: Request) -> dict[str, Any]:
        try:
            shape = parse_shape(request.headers.get("x-triplane-shape", ""))
            dtype = parse_dtype(request.headers.get("x-triplane-dtype", ""))
        except UploadError as e:
            raise ApiError(400, "request", str(e)) from None
        if expected_bytes(shape, dtype) > upload_limit:
            raise ApiError(
                413,
                "too_large",
                f"a {dtype}{list(shape)} tensor is over the upload limit of {upload_limit} bytes",
            )
        body = await read_body(request, upload_limit, "upload")
        try:
            return scheduler.upload(body, shape, dtype).as_dict()
        except UploadError as e:
            raise ApiError(400, "request", str(e)) from None

    @api.post("/jobs", status_code=201)
    async def submit(request: Request) -> dict[str, Any]:
        body = await read_body(request, max_graph_bytes, "job request")
        try:
            doc = await asyncio.to_thread(json.loads, body) if len(body) > 65536 else json.loads(body)
        except (ValueError, RecursionError) as e:
            raise ApiError(400, "request", f"the body is not JSON: {e}") from None
        if not isinstance(doc, dict) or "graph" not in doc:
            raise ApiError(400, "request", 'expected {"graph": <graph document>, "fetch": [node ids]}')
        unknown = set(doc) - {"graph", "fetch", "deadline_s"}
        if unknown:
            raise ApiError(400, "request", f"unknown field(s) {sorted(unknown)} "
                                           "(known: ['deadline_s', 'fetch', 'graph'])")
        deadline_s = doc.get("deadline_s")  # the job fails (kind "deadline") if not ended by then
        if deadline_s is not None and (type(deadline_s) not in (int, float) or not 0 < deadline_s <= 604800):
            raise ApiError(400, "request", f"'deadline_s' must be seconds in (0, 604800], "
                                           f"got {deadline_s!r:.40}")
        graph = doc["graph"]
        fetch = doc.get("fetch")
        if fetch is None and isinstance(graph, dict):
            fetch = list(graph.get("outputs") or [])
        body_out = await scheduler.submit(graph, fetch, deadline_s)
        return {"id": body_out["id"], "state": body_out["state"]}

    @api.get("/jobs")
    async def jobs(limit: int = 50) -> list[dict[str, Any]]:
        if not 1 <= limit <= 1000:
            raise ApiError(400, "request", "limit must be in 1..1000")
        return scheduler.list_jobs(limit)

    @api.get("/jobs/{job}")
    async def job_status(job: str) -> dict[str, Any]:
        return scheduler.status(job)

    @api.get("/jobs/{job}/wait")
    async def job_wait(job: str, timeout: float = 30.0) -> dict[str, Any]:
        if not 0 <= timeout <= 3600:
            raise ApiError(400, "request", "timeout must be in 0..3600 seconds")
        return await scheduler.wait(job, min(timeout, MAX_WAIT_S))

    @api.get("/jobs/{job}/tensors/{name}")
    async def tensor(job: str, name: str) -> StreamingResponse:
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

    @api.get("/jobs/{job}/plan")
    async def job_plan(job: str) -> dict[str, Any]:
        return await scheduler.plan(job)

    @api.delete("/jobs/{job}")
    async def cancel(job: str) -> dict[str, Any]:
        return await scheduler.cancel(job)

    @api.get("/nodes")
    async def nodes() -> list[dict[str, Any]]:
        return await scheduler.nodes()

    @api.get("/engines")
    async def engines() -> list[dict[str, Any]]:
        return await scheduler.engines()

    @api.get("/stats")
    async def stats() -> JSONResponse:
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
    if isinstance(scheduler.registry, MemoryBackend):
        _mount_registry(app, scheduler.registry, token_b)
    return app


def _mount_registry(app: FastAPI, backend: MemoryBackend, token: bytes) -> None:
    try:
        from triplane.registry.http import registry_router
    except ImportError:
        log.warning("triplane.registry.http is not available: the in-memory registry is not served")
        return
    app.include_router(registry_router(backend, token.decode()))
