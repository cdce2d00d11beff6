"""Who may call what on the gRPC service (docs/grpc.md): every method x every credential,
the ownership of a submit token's jobs, and the error table on the wire (code, details,
``triplane-error`` trailing metadata).

The service runs in this process on 127.0.0.1 over a Scheduler that is not started (jobs
are accepted and stay running; no executor runs them), as the REST role test does
(tests/unit/scheduler/test_sched_auth.py); the client is a real gRPC channel.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from triplane import metadb as mdb
from triplane.registry import MemoryBackend, OpEngineInfo
from triplane.registry.credential import node_credential
from triplane.registry.records import encode
from triplane.scheduler.api.auth import Authenticator
from triplane.scheduler.api.tokens import add_token
from triplane.scheduler.grpc import triplane_pb2 as pb
from triplane.scheduler.grpc import triplane_pb2_grpc as pb_grpc
from triplane.scheduler.grpc.service import ROLES, serve
from triplane.scheduler.grpc.status import ERROR_KEY
from triplane.scheduler.service import Scheduler

ADMIN = "admin-token-0123456789"
SECRET = b"s" * 32
CREDENTIALS = ("admin", "submit", "read", "none", "wrong", "node")
C = grpc.StatusCode

# Who may call each method ("any" client role: admin, submit, read). Everyone else gets
# PERMISSION_DENIED if the credential is known (a client token, the node credential), else
# UNAUTHENTICATED. Written out here, not read from the service, so that the test says it.
READERS = {"admin", "submit", "read"}
CHANGERS = {"admin", "submit"}
METHODS: dict[str, set[str]] = {
    "SubmitJob": CHANGERS, "GetJob": READERS, "WatchJob": READERS, "CancelJob": CHANGERS,
    "UploadTensor": CHANGERS, "FetchTensor": READERS, "ListNodes": READERS,
}


class Served:
    """A scheduler with one token per role (submit tokens ``alice`` and ``bob``), its gRPC
    service on a free port and a client stub."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        tokens = tmp_path / "tokens.json"
        self.tokens = {
            "admin": ADMIN,
            "submit": add_token(tokens, "alice", "submit"),
            "bob": add_token(tokens, "bob", "submit"),
            "read": add_token(tokens, "reader", "read"),
            "node": node_credential(SECRET),
            "wrong": "not-a-token-of-this-cluster",
        }

    async def __aenter__(self) -> Served:
        registry = MemoryBackend()
        info = OpEngineInfo("ex1", "numpy", "numpy", "cpu", ("exp", "add"), ("float32",), 1.0, 1.0)
        await registry.put(info.key(), encode(info))
        self.db = mdb.open_db(f"sqlite:///{self.tmp_path / 'meta.sqlite3'}")
        self.scheduler = Scheduler(registry=registry, db=self.db, run_dir=self.tmp_path, secret=SECRET)
        auth = Authenticator(ADMIN, tokens_file=self.tmp_path / "tokens.json",
                             node_credential=node_credential(SECRET))
        self.server, port = await serve(self.scheduler, auth, "127.0.0.1", 0, max_upload_bytes=1 << 16)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.TriplaneStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(0)
        self.db.close()

    def metadata(self, who: str) -> tuple[tuple[str, str], ...]:
        return () if who == "none" else (("authorization", f"Bearer {self.tokens[who]}"),)

    def upload(self, owner: str = "alice") -> str:
        return self.scheduler.upload(np.ones((2, 2), np.float32).tobytes(), (2, 2), "float32", owner).id

    async def submit(self, owner: str = "alice") -> str:
        body = job_request(self.upload(owner))
        return (await self.scheduler.submit(body["graph"], body["fetch"], owner=owner))["id"]


def job_request(upload: str) -> dict[str, Any]:
    return {"graph": {"version": 1, "nodes": {
        "x": {"op": "input", "shape": [2, 2], "dtype": "float32",
              "attrs": {"tensor": upload, "shape": [2, 2], "dtype": "float32"}},
        "y": {"op": "exp", "inputs": ["x"], "shape": [2, 2], "dtype": "float32"}}, "outputs": ["y"]},
        "fetch": ["y"]}


async def chunks(shape: list[int], data: bytes, dtype: str = "float32") -> AsyncIterator[pb.TensorChunk]:
    yield pb.TensorChunk(header=pb.TensorHeader(shape=shape, dtype=dtype))
    yield pb.TensorChunk(data=data)


def call(s: Served, method: str, who: str, job: str) -> Awaitable[Any]:
    """One call of ``method`` as ``who`` on ``job`` (alice's), awaiting its whole answer."""
    md = s.metadata(who)

    async def drain(stream: Any) -> list[Any]:
        return [m async for m in stream]

    requests: dict[str, Callable[[], Awaitable[Any]]] = {
        "SubmitJob": lambda: s.stub.SubmitJob(pb.SubmitJobRequest(
            request=json.dumps(job_request(s.upload())).encode()), metadata=md),
        "GetJob": lambda: s.stub.GetJob(pb.GetJobRequest(job=job), metadata=md),
        # the job never ends here: a stream that is let through runs until its deadline
        "WatchJob": lambda: drain(s.stub.WatchJob(pb.WatchJobRequest(job=job), metadata=md, timeout=1.0)),
        "CancelJob": lambda: s.stub.CancelJob(pb.CancelJobRequest(job=job), metadata=md),
        "UploadTensor": lambda: s.stub.UploadTensor(chunks([2, 2], bytes(16)), metadata=md),
        "FetchTensor": lambda: drain(s.stub.FetchTensor(pb.FetchTensorRequest(job=job, name="y"),
                                                        metadata=md)),
        "ListNodes": lambda: s.stub.ListNodes(pb.ListNodesRequest(), metadata=md),
    }
    return requests[method]()


def error_of(e: grpc.aio.AioRpcError) -> dict[str, Any]:
    return json.loads(dict(e.trailing_metadata() or ())[ERROR_KEY])


def test_the_table_covers_every_method_of_the_service() -> None:
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["Triplane"].methods}
    assert set(METHODS) == methods
    assert {m: set(roles) for m, (roles, _) in ROLES.items()} == METHODS


@pytest.mark.parametrize("who", CREDENTIALS)
def test_role_matrix_every_method(tmp_path: Path, who: str) -> None:
    """Each method answers each credential as the table says: let through (any code but
    UNAUTHENTICATED, PERMISSION_DENIED and the server's own failures), PERMISSION_DENIED
    with kind "forbidden" for a known credential whose role may not, UNAUTHENTICATED for
    none or a wrong one."""

    async def main() -> None:
        async with Served(tmp_path) as s:
            for method, allowed in METHODS.items():  # CancelJob cancels: each call gets a fresh job
                job = await s.submit("alice")
                try:
                    await call(s, method, who, job)
                    code, err = C.OK, None
                except grpc.aio.AioRpcError as e:
                    code, err = e.code(), e
                where = f"{who}: {method} -> {code} {err.details() if err else ''}"
                if who in allowed:
                    assert code not in (C.UNAUTHENTICATED, C.PERMISSION_DENIED, C.INTERNAL, C.UNKNOWN), where
                elif who in ("none", "wrong"):
                    assert code == C.UNAUTHENTICATED, where
                    assert err is not None and error_of(err)["kind"] == "unauthorized", where
                else:
                    assert code == C.PERMISSION_DENIED, where
                    assert err is not None and error_of(err)["kind"] == "forbidden", where
                    assert "may not" in err.details(), where

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_submit_token_sees_and_cancels_only_its_own_jobs(tmp_path: Path) -> None:
    async def main() -> None:
        async with Served(tmp_path) as s:
            mine, theirs = await s.submit("alice"), await s.submit("bob")
            for method in ("GetJob", "WatchJob", "CancelJob", "FetchTensor"):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call(s, method, "submit", theirs)
                assert e.value.code() == C.PERMISSION_DENIED, method
                assert f"job {theirs} is not one of the jobs of 'alice'" in e.value.details()
            job = await s.stub.GetJob(pb.GetJobRequest(job=mine), metadata=s.metadata("submit"))
            assert (job.id, job.state, job.total) == (mine, "running", 1)
            assert json.loads(job.json)["id"] == mine
            bobs = await s.stub.GetJob(pb.GetJobRequest(job=theirs), metadata=s.metadata("read"))
            assert bobs.state == "running"  # a read token sees everyone's, bob's still runs
            done = await s.stub.CancelJob(pb.CancelJobRequest(job=mine), metadata=s.metadata("submit"))
            assert done.state == "cancelled"
            with s.db.read() as db:
                assert mdb.get_job(db, mine).owner == "alice"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_errors_carry_their_code_message_and_body(tmp_path: Path) -> None:
    async def main() -> None:
        async with Served(tmp_path) as s:
            md = s.metadata("admin")
            bad = job_request(s.upload())
            bad["graph"]["nodes"]["y"]["inputs"] = ["nope"]
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await s.stub.SubmitJob(pb.SubmitJobRequest(request=json.dumps(bad).encode()), metadata=md)
            assert e.value.code() == C.INVALID_ARGUMENT
            body = error_of(e.value)
            assert body["node"] == "y" and "nope" in body["message"] and body["message"] == e.value.details()
            for text, what in ((b'{"graph": {}, "graph": {}}', "strict JSON"), (b"[1", "not JSON"),
                               (b'{"graph": {}, "colour": 1}', "unknown field")):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await s.stub.SubmitJob(pb.SubmitJobRequest(request=text), metadata=md)
                assert e.value.code() == C.INVALID_ARGUMENT and what in e.value.details(), text
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await s.stub.GetJob(pb.GetJobRequest(job="j0000000000000000"), metadata=md)
            assert e.value.code() == C.NOT_FOUND and error_of(e.value)["kind"] == "not_found"
            job = await s.submit("alice")
            with pytest.raises(grpc.aio.AioRpcError) as e:  # still running
                await call(s, "FetchTensor", "admin", job)
            assert e.value.code() == C.FAILED_PRECONDITION and error_of(e.value)["kind"] == "not_ready"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_uploads_are_bounded_and_checked(tmp_path: Path) -> None:
    async def main() -> None:
        async with Served(tmp_path) as s:  # an upload limit of 64 KiB
            md = s.metadata("submit")
            data = np.arange(6, dtype=np.float32)
            t = await s.stub.UploadTensor(chunks([2, 3], data.tobytes()), metadata=md)
            assert (list(t.shape), t.dtype, t.nbytes) == ([2, 3], "float32", 24)
            assert s.scheduler.store.get(t.id).owner == "alice"
            cases: list[tuple[Any, grpc.StatusCode, str]] = [
                (chunks([1 << 20], b""), C.RESOURCE_EXHAUSTED, "over the upload limit of 65536 bytes"),
                (chunks([2, 3], bytes(25)), C.INVALID_ARGUMENT, "the chunks sent more"),
                (chunks([2, 3], bytes(20)), C.INVALID_ARGUMENT, "is 24 bytes, the body has 20"),
                (chunks([2, 3], bytes(24), "float99"), C.INVALID_ARGUMENT, "unknown X-Triplane-Dtype"),
                (chunks([2, -3], b""), C.INVALID_ARGUMENT, "non-negative"),
                (chunks([1] * 40, b""), C.INVALID_ARGUMENT, "more than the limit"),
                (iter([pb.TensorChunk(data=b"1234")]), C.INVALID_ARGUMENT, "starts with a TensorChunk"),
            ]
            for request, code, text in cases:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await s.stub.UploadTensor(request, metadata=md)
                assert e.value.code() == code and text in e.value.details(), (text, e.value.details())
            big = b'{"graph": "' + b"x" * (33 << 20) + b'"}'  # over the 32 MiB of a job request
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await s.stub.SubmitJob(pb.SubmitJobRequest(request=big), metadata=md)
            assert e.value.code() == C.RESOURCE_EXHAUSTED

    asyncio.run(asyncio.wait_for(main(), 60))


def test_watch_streams_a_jobs_events_to_its_end_and_resumes_after_an_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with Served(tmp_path) as s:
            md = s.metadata("submit")
            job, other = await s.submit("alice"), await s.submit("alice")
            live = s.stub.WatchJob(pb.WatchJobRequest(job=job), metadata=md, timeout=30)
            first = await live.read()  # the stream is open and has replayed the job's start
            assert (first.kind, first.job) == ("job.submitted", job)
            await s.scheduler.release_job(job)  # cancel: its last event ends the stream
            seen = [first]
            while (event := await live.read()) is not grpc.aio.EOF:
                seen.append(event)
            assert seen[-1].kind == "job.cancelled" and all(e.job == job for e in seen)
            assert [e.id for e in seen] == sorted({e.id for e in seen})
            assert all(isinstance(json.loads(e.data), dict) for e in seen)
            # the job has ended: a watch replays its stored events and ends; after an id, the rest
            again = [e async for e in s.stub.WatchJob(pb.WatchJobRequest(job=job), metadata=md)]
            assert [e.id for e in again] == [e.id for e in seen]
            resumed = s.stub.WatchJob(pb.WatchJobRequest(job=job, after=first.id), metadata=md)
            after = [e async for e in resumed]
            assert [e.id for e in after] == [e.id for e in seen[1:]]
            assert other not in {e.job for e in again}
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await drain_watch(s, "j0000000000000000")
            assert e.value.code() == C.NOT_FOUND

    asyncio.run(asyncio.wait_for(main(), 60))


async def drain_watch(s: Served, job: str) -> list[pb.Event]:
    return [e async for e in s.stub.WatchJob(pb.WatchJobRequest(job=job), metadata=s.metadata("admin"))]


def test_a_compiled_step_and_a_waiting_submit_go_through_the_same_front_door(tmp_path: Path) -> None:
    """REST's other request forms: ``{"plan", "args", "fetch"}`` (new inputs for a known plan)
    and ``wait_s`` (the answer once the job ends or the wait is over); ``inline`` is REST's."""

    async def main() -> None:
        async with Served(tmp_path) as s:
            md = s.metadata("submit")

            def request(doc: dict[str, Any]) -> pb.SubmitJobRequest:
                return pb.SubmitJobRequest(request=json.dumps(doc).encode())

            first = await s.stub.SubmitJob(request(job_request(s.upload())), metadata=md)
            assert len(first.plan) == 64 and json.loads(first.json)["args"]
            inline = {"shape": [2, 2], "dtype": "float32", "data": base64.b64encode(bytes(16)).decode()}
            step = {"plan": first.plan, "args": [inline], "fetch": ["y"]}
            again = await s.stub.SubmitJob(request(step), metadata=md)
            assert again.id != first.id and again.state == "running" and again.total == first.total
            unknown = {**step, "plan": "0" * 64}
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await s.stub.SubmitJob(request(unknown), metadata=md)
            assert e.value.code() == C.FAILED_PRECONDITION and error_of(e.value)["kind"] == "unknown_plan"
            waited = {**job_request(s.upload()), "wait_s": 0.2}  # no executor: still running after it
            job = await s.stub.SubmitJob(request(waited), metadata=md)
            assert job.state == "running"
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await s.stub.SubmitJob(request({**waited, "inline": ["y"]}), metadata=md)
            assert e.value.code() == C.INVALID_ARGUMENT and "FetchTensor" in e.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as e:  # a pipelined step's values: REST only too
                await s.stub.SubmitJob(request({**step, "inline_refs": [f"{first.id}:y"]}), metadata=md)
            assert e.value.code() == C.INVALID_ARGUMENT and "inline_refs" in e.value.details()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_connection_that_never_speaks_http2_is_closed(tmp_path: Path) -> None:
    """A half-open connection does not hold the port: closed at the handshake deadline."""

    async def main() -> float:
        registry = MemoryBackend()
        db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
        scheduler = Scheduler(registry=registry, db=db, run_dir=tmp_path, secret=SECRET)
        server, port = await serve(scheduler, Authenticator(ADMIN), "127.0.0.1", 0, handshake_timeout_s=0.5)
        try:
            def silent() -> float:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                    started = time.monotonic()
                    while c.recv(4096):  # the server's SETTINGS frame, then the close
                        pass
                    return time.monotonic() - started

            return await asyncio.to_thread(silent)
        finally:
            await server.stop(0)
            db.close()

    assert asyncio.run(asyncio.wait_for(main(), 30)) < 5.0
