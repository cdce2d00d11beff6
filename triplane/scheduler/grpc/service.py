"""The gRPC service of ``proto/triplane.proto`` over a :class:`~triplane.scheduler.service.Scheduler`.

A thin layer, as the REST routes (``api/app.py``) are: each call checks the caller, then
awaits the same Scheduler coroutine the matching route awaits. A job request is the REST
body, parsed by the same front door (``parse_job_request``); a submit token sees and
cancels only its own jobs (the same ``Owners`` check). Who may call what is :data:`ROLES`.
Errors end the call with the code of their kind (``status.py``).

Bounds, as REST's: a job request of at most ``max_graph_bytes`` (gRPC refuses a larger
message with RESOURCE_EXHAUSTED before it is read), an upload of at most the upload limit
(refused from its header when the declared tensor is larger, and as soon as its chunks
pass the declared size), at most :data:`MAX_CALLS` calls at once (WatchJob streams
included: one more is RESOURCE_EXHAUSTED), and the connection limits of ``server_options``.
``serve`` starts a ``grpc.aio`` server on the running event loop (the dispatcher's, uvloop
or asyncio's).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

import grpc

from triplane.proto.limits import MAX_RANK
from triplane.scheduler.api.app import MAX_GRAPH_BYTES, Owners
from triplane.scheduler.api.auth import ANYONE, CHANGERS, NODE, Authenticator, Principal
from triplane.scheduler.api.bound import BoundRequest
from triplane.scheduler.api.jobrequest import parse_job_request
from triplane.scheduler.errors import BadRequest, Forbidden, TooLarge
from triplane.scheduler.grpc import triplane_pb2 as pb
from triplane.scheduler.grpc import triplane_pb2_grpc as pb_grpc
from triplane.scheduler.grpc.status import abort, unary
from triplane.scheduler.refs import refs_in_args, refs_in_graph
from triplane.scheduler.service import Scheduler
from triplane.scheduler.store import UploadError, expected_bytes, parse_dtype, parse_shape

__all__ = ["CHUNK_BYTES", "MAX_CALLS", "ROLES", "TERMINAL", "TriplaneService", "serve"]

CHUNK_BYTES = 1 << 20  # FetchTensor's data messages (and the most an upload chunk should carry)
MAX_CALLS = 1024
TERMINAL = frozenset({"job.done", "job.failed", "job.cancelled"})  # a job's last event
_ENDED = frozenset({"done", "failed", "cancelled"})

# method -> (the roles that may call it, what the refusal says they may not do). The node
# credential is in none of them (it opens the served registry only); docs/grpc.md's table.
ROLES: dict[str, tuple[frozenset[str], str]] = {
    "SubmitJob": (frozenset(CHANGERS), "submit jobs"),
    "GetJob": (frozenset(ANYONE), "read jobs"),
    "WatchJob": (frozenset(ANYONE), "watch jobs"),
    "CancelJob": (frozenset(CHANGERS), "cancel jobs"),
    "UploadTensor": (frozenset(CHANGERS), "upload tensors"),
    "FetchTensor": (frozenset(ANYONE), "fetch tensors"),
    "ListNodes": (frozenset(ANYONE), "list nodes"),
}

Req = TypeVar("Req")
Rep = TypeVar("Rep")


def _streaming(fn: Callable[[Any, Req, grpc.aio.ServicerContext], AsyncIterator[Rep]]) -> Any:
    """A server-streaming handler whose errors (before or between messages) end the call
    with their gRPC code."""

    @functools.wraps(fn)
    async def handler(self: Any, request: Req, context: grpc.aio.ServicerContext) -> AsyncIterator[Rep]:
        try:
            async for reply in fn(self, request, context):
                yield reply
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as e:
            await abort(context, e)

    return handler


def _job(body: Mapping[str, Any]) -> pb.Job:
    """A status body (``Jobs.status``, with ``plan`` after a submit) as a Job message."""
    progress = body.get("progress") or {}
    error = body.get("error")
    return pb.Job(
        id=body["id"], state=body["state"], done=int(progress.get("done") or 0),
        total=int(progress.get("total") or 0),
        error=pb.Error(kind=str(error.get("kind") or ""), message=str(error.get("message") or ""),
                       node=str(error.get("node") or ""), op=str(error.get("op") or ""))
        if isinstance(error, dict) else None,
        created=float(body.get("created") or 0.0), updated=float(body.get("updated") or 0.0),
        plan=str(body.get("plan") or ""), json=json.dumps(body, default=str),
    )


def _event(e: Any) -> pb.Event:
    return pb.Event(id=e.id, at=e.at, kind=e.kind, job=e.job or "", task=e.task or "", node=e.node or "",
                    data=json.dumps(e.data, default=str))


def _node(n: Mapping[str, Any]) -> pb.Node:
    memory = n.get("memory") or {}
    return pb.Node(id=str(n.get("node") or ""), address=str(n.get("address") or ""),
                   pid=int(n.get("pid") or 0), health=str(n.get("health") or ""),
                   running=int(n.get("running") or 0),
                   memory_capacity=int(memory.get("capacity") or 0), memory_free=int(memory.get("free") or 0),
                   json=json.dumps(n, default=str))


class TriplaneService(pb_grpc.TriplaneServicer):
    """The seven calls of ``triplane.v1.Triplane``; see the module doc."""

    def __init__(self, scheduler: Scheduler, auth: Authenticator, *, max_graph_bytes: int = MAX_GRAPH_BYTES,
                 max_upload_bytes: int | None = None) -> None:
        self.scheduler = scheduler
        self.auth = auth
        self.owners = Owners(scheduler.db)
        self.max_graph_bytes = max_graph_bytes
        self.upload_limit = max_upload_bytes if max_upload_bytes is not None else scheduler.store.max_bytes

    def caller(self, context: grpc.aio.ServicerContext, method: str) -> Principal:
        """The caller's principal if its role may call ``method``: Unauthorized (no or a wrong
        token) or Forbidden (a role not in :data:`ROLES`), as REST's ``Authenticator.require``."""
        header = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
        p = self.auth.identify(header if isinstance(header, str) else None)
        allowed, what = ROLES[method]
        if p.role not in allowed:
            who = "the node credential" if p.role == NODE else f"a {p.role} token ({p.name!r})"
            raise Forbidden(f"{who} may not {what} (roles that may: {sorted(allowed)})")
        return p

    @unary
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        p = self.caller(context, "SubmitJob")
        body = request.request
        if len(body) > self.max_graph_bytes:
            raise TooLarge(f"job request is over the limit of {self.max_graph_bytes} bytes")
        if len(body) > 65536:  # as REST: a large document is parsed off the event loop
            parsed, waiting, release = await asyncio.to_thread(parse_job_request, body)
        else:
            parsed, waiting, release = parse_job_request(body)
        if waiting is not None and waiting.inline:
            raise BadRequest("'inline' values are the REST API's: fetch them with FetchTensor")
        if isinstance(parsed, BoundRequest) and parsed.inline_refs:
            raise BadRequest("'inline_refs' values are the REST API's: fetch them with FetchTensor")
        if release:
            raise BadRequest("'release' is the REST API's: release jobs with CancelJob")
        named = refs_in_args(parsed.args) if isinstance(parsed, BoundRequest) else refs_in_graph(parsed.graph)
        for ref in named:  # whoever may fetch a tensor may use it as a ref
            self.owners.check(p, ref.partition(":")[0])
        if isinstance(parsed, BoundRequest):  # a compiled step: new inputs for a known plan
            out = await self.scheduler.submit_bound(*parsed, owner=p.name)
        else:
            out = await self.scheduler.submit(parsed.graph, parsed.fetch, parsed.deadline_s, owner=p.name,
                                              grad=parsed.grad, persist=parsed.persist, name=parsed.name,
                                              tags=parsed.tags, prefer=parsed.prefer)
        job = out["id"]
        status = (await self.scheduler.wait(job, waiting.wait_s) if waiting is not None
                  else self.scheduler.status(job))
        return _job({**status, "plan": out.get("plan"), "args": out.get("args")})

    @unary
    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        p = self.caller(context, "GetJob")
        self.owners.check(p, request.job)
        return _job(self.scheduler.status(request.job))

    @unary
    async def CancelJob(self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        p = self.caller(context, "CancelJob")
        self.owners.check(p, request.job)
        return _job(await self.scheduler.release_job(request.job))

    @_streaming
    async def WatchJob(self, request: pb.WatchJobRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Event]:
        p = self.caller(context, "WatchJob")
        self.owners.check(p, request.job)
        after = request.after  # 0: from the job's first event
        ended = self.scheduler.status(request.job)["state"] in _ENDED  # NotFound for an unknown job
        events = self.scheduler.events
        if ended:  # its events are all published: no live subscription that might wait for ever
            while True:
                page = await events.aquery(job=request.job, after=after, limit=500)
                for e in page:
                    yield _event(e)
                if len(page) < 500:
                    return
                after = page[-1].id
        # A subscription that falls behind catches up by id by itself (events.py): no gap, no repeat.
        async with events.subscribe(job=request.job, after=after) as subscription:
            async for e in subscription:
                yield _event(e)
                if e.kind in TERMINAL:
                    return

    @unary
    async def UploadTensor(self, request_iterator: AsyncIterator[pb.TensorChunk],
                           context: grpc.aio.ServicerContext) -> pb.Tensor:
        p = self.caller(context, "UploadTensor")
        chunks = aiter(request_iterator)
        first = await anext(chunks, None)
        if first is None or first.WhichOneof("part") != "header":
            raise BadRequest("an upload starts with a TensorChunk holding its header (shape, dtype)")
        header = first.header
        if len(header.shape) > MAX_RANK:
            raise BadRequest(f"shape has {len(header.shape)} dimensions, more than the limit of {MAX_RANK}",
                             kind="limit")
        try:
            shape = parse_shape(",".join(str(s) for s in header.shape))
            dtype = parse_dtype(header.dtype)
        except UploadError as e:
            raise BadRequest(str(e)) from None
        need = expected_bytes(shape, dtype)
        if need > self.upload_limit:
            raise TooLarge(f"a {dtype}{list(shape)} tensor is over the upload limit of "
                           f"{self.upload_limit} bytes")
        data = bytearray()
        async for chunk in chunks:
            if chunk.WhichOneof("part") != "data":
                raise BadRequest("only the first TensorChunk of an upload holds a header")
            data += chunk.data
            if len(data) > need:
                raise BadRequest(f"{dtype}{list(shape)} is {need} bytes; the chunks sent more")
        try:
            stored = self.scheduler.upload(data, shape, dtype, owner=p.name)
        except UploadError as e:
            raise BadRequest(str(e)) from None
        return pb.Tensor(id=stored.id, shape=list(stored.shape), dtype=stored.dtype, nbytes=stored.nbytes)

    @_streaming
    async def FetchTensor(self, request: pb.FetchTensorRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[pb.TensorChunk]:
        p = self.caller(context, "FetchTensor")
        self.owners.check(p, request.job)
        shape, dtype, nbytes, chunks = await self.scheduler.open_tensor(request.job, request.name)
        yield pb.TensorChunk(header=pb.TensorHeader(shape=list(shape), dtype=dtype, nbytes=nbytes))
        async for chunk in chunks:
            view = memoryview(chunk)
            for start in range(0, len(view), CHUNK_BYTES):
                yield pb.TensorChunk(data=bytes(view[start:start + CHUNK_BYTES]))

    @unary
    async def ListNodes(self, request: pb.ListNodesRequest,
                        context: grpc.aio.ServicerContext) -> pb.ListNodesResponse:
        self.caller(context, "ListNodes")
        return pb.ListNodesResponse(nodes=[_node(n) for n in await self.scheduler.nodes()])


def server_options(max_graph_bytes: int, handshake_timeout_s: float = 10.0) -> list[tuple[str, Any]]:
    """The channel arguments of the server: a job request fits one message (with room for
    its framing); a connection that has not completed its HTTP/2 handshake within
    ``handshake_timeout_s`` is closed (REST's idle limit: no half-open connection holds the
    port), one with no call for 5 minutes too (clients reconnect by themselves); at most
    100 calls at once on one connection; no SO_REUSEPORT (gRPC's default on Linux would let
    a second server share a port that is in use instead of failing)."""
    return [("grpc.max_receive_message_length", max_graph_bytes + 4096),
            ("grpc.max_send_message_length", 4 * CHUNK_BYTES),
            ("grpc.server_handshake_timeout_ms", int(handshake_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", 300_000),
            ("grpc.max_concurrent_streams", 100),
            ("grpc.so_reuseport", 0)]


async def serve(scheduler: Scheduler, auth: Authenticator, host: str, port: int, *,
                max_graph_bytes: int = MAX_GRAPH_BYTES, max_upload_bytes: int | None = None,
                handshake_timeout_s: float = 10.0) -> tuple[grpc.aio.Server, int]:
    """Start serving ``triplane.v1.Triplane`` on ``host:port`` (0: any free port) in the
    running event loop; (the server, the port bound). OSError if the port cannot be bound.
    Stop it with ``await server.stop(grace_s)``."""
    server = grpc.aio.server(options=server_options(max_graph_bytes, handshake_timeout_s),
                             maximum_concurrent_rpcs=MAX_CALLS)
    service = TriplaneService(scheduler, auth, max_graph_bytes=max_graph_bytes,
                              max_upload_bytes=max_upload_bytes)
    pb_grpc.add_TriplaneServicer_to_server(service, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:  # grpcio >= 1.50 raises where older ones returned 0
        raise OSError(f"cannot listen for gRPC on {host}:{port}: {e}") from None
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    await server.start()
    return server, bound
