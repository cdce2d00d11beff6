"""``GET /v1/events`` (a page, or with ``Accept: text/event-stream`` a live stream of
server-sent events) and ``GET /metrics`` (Prometheus text format); docs/observability.md.

Any client role may read both; a submit token sees only its own jobs' events (no executor
events, no other token's jobs). A page is ``{"items": [event...], "next": cursor | null}``:
``next`` is an opaque cursor (pass it as ``cursor``) when the page was full, null when no
more events were there when it was read (to follow newer ones, pass ``after`` = the last
id, or stream). The stream sends each event as ``id: <event id>``, ``event: <kind>``,
``data: <the event as JSON>``, and a comment line (``: keep-alive``) when nothing happened
for ``keepalive_s``; a client that reconnects with ``Last-Event-ID`` (or ``after``) gets
every event after that id exactly once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from triplane.scheduler.api.auth import ANYONE, Authenticator, Principal
from triplane.scheduler.errors import BadRequest
from triplane.scheduler.events import KINDS, Event
from triplane.scheduler.metrics import CONTENT_TYPE
from triplane.scheduler.service import Scheduler

__all__ = ["EventOut", "EventPage", "events_router"]

KEEPALIVE_S = 15.0
SSE = "text/event-stream"


class EventOut(BaseModel):
    id: int
    at: float
    kind: str
    job: str | None
    task: str | None
    node: str | None
    data: dict[str, Any]


class EventPage(BaseModel):
    items: list[EventOut]
    next: str | None


def encode_cursor(after: int) -> str:
    raw = json.dumps({"after": after}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> int:
    """The event id a cursor continues after; BadRequest for anything not made by
    ``encode_cursor``."""
    try:
        doc = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after = doc["after"]
    except (ValueError, TypeError, KeyError) as e:
        raise BadRequest(f"bad cursor {cursor[:40]!r} (pass back the 'next' of a page): {e}") from None
    if type(after) is not int or after < 0:
        raise BadRequest(f"bad cursor {cursor[:40]!r}: not one this API made")
    return after


def _start(after: int | None, cursor: str | None, last_event_id: str | None) -> int | None:
    if cursor is not None:
        return decode_cursor(cursor)
    if last_event_id is not None:
        if not last_event_id.strip().isdigit():
            raise BadRequest(f"Last-Event-ID must be an event id, got {last_event_id[:40]!r}")
        return int(last_event_id)
    return after


def _kinds(kind: list[str] | None) -> list[str] | None:
    if not kind:
        return None
    unknown = sorted(set(kind) - KINDS)
    if unknown:
        raise BadRequest(f"unknown event kind(s) {unknown} (known: {sorted(KINDS)})")
    return kind


def sse_frame(e: Event) -> bytes:
    body = json.dumps(e.as_dict(), separators=(",", ":"), allow_nan=False)
    return f"id: {e.id}\nevent: {e.kind}\ndata: {body}\n\n".encode()


def events_router(scheduler: Scheduler, auth: Authenticator, check_job: Callable[[Principal, str], None],
                  *, keepalive_s: float = KEEPALIVE_S) -> APIRouter:
    """The routes; ``check_job(principal, job)`` raises Forbidden unless the caller may see
    ``job`` (api/app.py's ``Owners.check``)."""
    router = APIRouter()
    anyone = Depends(auth.require(ANYONE, "read events and metrics"))
    bus = scheduler.events

    @router.get("/v1/events", response_model=EventPage,
                responses={200: {"content": {SSE: {"schema": {"type": "string"}}},
                                 "description": "A page of events, or (Accept: text/event-stream) "
                                                "a live stream of them"}})
    async def events(request: Request, job: str | None = None,
                     kind: Annotated[list[str] | None, Query()] = None,
                     after: Annotated[int | None, Query(ge=0)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 50,
                     cursor: str | None = None, p: Principal = anyone) -> Any:
        if job is not None:
            check_job(p, job)
        kinds = _kinds(kind)
        owner = None if p.sees_all_jobs else p.name
        if SSE in request.headers.get("accept", ""):
            start = _start(after, cursor, request.headers.get("last-event-id"))
            sub = bus.subscribe(job=job, after=start, kinds=kinds, owner=owner)
            return StreamingResponse(_stream(sub, keepalive_s), media_type=SSE,
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        start = _start(after, cursor, None)
        items = await bus.aquery(job=job, kinds=kinds, after=start, limit=limit, owner=owner)
        nxt = encode_cursor(items[-1].id) if len(items) == limit else None
        return {"items": [e.as_dict() for e in items], "next": nxt}  # checked by response_model

    @router.get("/metrics", response_class=Response,
                responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                 "description": "Prometheus text exposition format"}})
    async def metrics(p: Principal = anyone) -> Response:
        await scheduler.refresh_metrics()
        return Response(scheduler.metrics.render(), media_type=CONTENT_TYPE)

    return router


async def _stream(sub: Any, keepalive_s: float) -> AsyncIterator[bytes]:
    """The subscription as SSE frames; a comment every ``keepalive_s`` of silence. The
    response ends when the client goes (the subscription is closed)."""
    nxt: asyncio.Future[Event] | None = None
    try:
        yield b": connected\n\n"
        while True:
            if nxt is None:
                nxt = asyncio.ensure_future(sub.__anext__())
            done, _ = await asyncio.wait({nxt}, timeout=keepalive_s)
            if not done:
                yield b": keep-alive\n\n"
                continue
            try:
                e = nxt.result()
            except StopAsyncIteration:
                return
            nxt = None
            yield sse_frame(e)
    finally:
        sub.close()
        if nxt is not None:
            nxt.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await nxt
