"""A gRPC client of a live cluster, run as its own process by test_cluster_grpc.py.

    python grpc_client.py HOST:PORT        (the token in $TRIPLANE_TOKEN)

It uses the generated stubs only (no SDK): lists the nodes, uploads two matrices in
256 KiB chunks, submits ``y = a @ b`` and ``z = exp(y)`` as the REST API's JSON document,
watches the job's events to its end, fetches ``y`` and ``z`` and compares them with numpy;
submits the same graph with no shapes and a gradient request (REST's front door: the
values equal numpy's, a wrong shape is refused naming the node and its loc); then submits
a long chain of matmuls, cancels it at once and watches it end. Any difference is an
AssertionError (exit 1); on success it prints one JSON line saying what it saw, for the
test to check.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import grpc
import numpy as np

from triplane.scheduler.grpc import triplane_pb2 as pb
from triplane.scheduler.grpc import triplane_pb2_grpc as pb_grpc

UPLOAD_CHUNK = 256 * 1024


def upload(stub: pb_grpc.TriplaneStub, md: list[tuple[str, str]], arr: np.ndarray) -> str:
    def chunks() -> Iterator[pb.TensorChunk]:
        yield pb.TensorChunk(header=pb.TensorHeader(shape=list(arr.shape), dtype=str(arr.dtype)))
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
        for start in range(0, len(raw), UPLOAD_CHUNK):
            yield pb.TensorChunk(data=raw[start:start + UPLOAD_CHUNK])

    t = stub.UploadTensor(chunks(), metadata=md)
    assert (list(t.shape), t.dtype, t.nbytes) == (list(arr.shape), str(arr.dtype), arr.nbytes), t
    return t.id


def fetch(stub: pb_grpc.TriplaneStub, md: list[tuple[str, str]], job: str,
          name: str) -> tuple[np.ndarray, int]:
    """The tensor and how many data messages carried it."""
    stream = stub.FetchTensor(pb.FetchTensorRequest(job=job, name=name), metadata=md)
    header = next(stream).header
    parts = [m.data for m in stream]
    data = b"".join(parts)
    assert len(data) == header.nbytes, (len(data), header.nbytes)
    arr = np.frombuffer(data, dtype=np.dtype(header.dtype).newbyteorder("<")).reshape(tuple(header.shape))
    return arr, len(parts)


def node(op: str, shape: list[int], inputs: list[str]) -> dict[str, object]:
    return {"op": op, "shape": shape, "dtype": "float32", "inputs": inputs}


def input_node(upload: str, shape: list[int]) -> dict[str, object]:
    return {"op": "input", "shape": shape, "dtype": "float32",
            "attrs": {"tensor": upload, "shape": shape, "dtype": "float32"}}


def submit(stub: pb_grpc.TriplaneStub, md: list[tuple[str, str]], nodes: dict[str, object],
           fetch_: list[str]) -> pb.Job:
    doc = {"graph": {"version": 1, "nodes": nodes, "outputs": fetch_}, "fetch": fetch_}
    return stub.SubmitJob(pb.SubmitJobRequest(request=json.dumps(doc).encode()), metadata=md)


def watch(stub: pb_grpc.TriplaneStub, md: list[tuple[str, str]], job: str) -> list[pb.Event]:
    events = list(stub.WatchJob(pb.WatchJobRequest(job=job), metadata=md, timeout=120))
    ids = [e.id for e in events]
    assert ids == sorted(set(ids)), f"event ids not strictly increasing: {ids}"
    assert all(e.job == job for e in events), events
    return events


def main(address: str) -> dict[str, object]:
    md = [("authorization", f"Bearer {os.environ['TRIPLANE_TOKEN']}")]
    rng = np.random.default_rng(7)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.TriplaneStub(channel)
        nodes = stub.ListNodes(pb.ListNodesRequest(), metadata=md).nodes
        assert nodes and all(n.id and n.pid and json.loads(n.json)["node"] == n.id for n in nodes), nodes

        a = (rng.standard_normal((600, 500)) * 0.05).astype(np.float32)
        b = (rng.standard_normal((500, 700)) * 0.05).astype(np.float32)
        ua, ub = upload(stub, md, a), upload(stub, md, b)
        graph = {"a": input_node(ua, [600, 500]), "b": input_node(ub, [500, 700]),
                 "y": node("matmul", [600, 700], ["a", "b"]),
                 "z": node("exp", [600, 700], ["y"])}
        job = submit(stub, md, graph, ["y", "z"])
        assert job.state in ("running", "done") and job.plan, job
        events = watch(stub, md, job.id)
        assert events[-1].kind == "job.done", [e.kind for e in events]
        status = stub.GetJob(pb.GetJobRequest(job=job.id), metadata=md)
        assert (status.state, status.done, status.total) == ("done", status.total, status.total), status
        y, y_messages = fetch(stub, md, job.id, "y")
        z, _ = fetch(stub, md, job.id, "z")
        want = a @ b
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(z, np.exp(want), rtol=1e-4, atol=1e-5)
        resumed = list(stub.WatchJob(pb.WatchJobRequest(job=job.id, after=events[0].id), metadata=md))
        assert [e.id for e in resumed] == [e.id for e in events[1:]], "resuming lost or repeated an event"

        # the same front door as REST: no shapes on the wire, a gradient asked for, a loc in errors
        untyped = {"a": {"op": "input", "attrs": {"tensor": ua}},
                   "b": {"op": "input", "attrs": {"tensor": ub}},
                   "y": {"op": "matmul", "inputs": ["a", "b"], "loc": "client.py:1"},
                   "loss": {"op": "sum", "inputs": ["y"]}}
        doc = {"graph": {"version": 1, "nodes": untyped, "outputs": ["loss"]}, "fetch": ["loss"],
               "grad": {"of": "loss", "wrt": ["b"]}, "wait_s": 60}
        graded = stub.SubmitJob(pb.SubmitJobRequest(request=json.dumps(doc).encode()), metadata=md)
        assert graded.state == "done", graded
        loss, _ = fetch(stub, md, graded.id, "loss")
        grad_b, _ = fetch(stub, md, graded.id, "grad:b")
        np.testing.assert_allclose(loss, want.sum(), rtol=1e-3)
        np.testing.assert_allclose(grad_b, np.repeat(a.sum(0)[:, None], 700, axis=1), rtol=1e-4, atol=1e-4)
        untyped["y"]["inputs"] = ["b", "a"]
        try:
            stub.SubmitJob(pb.SubmitJobRequest(request=json.dumps(doc).encode()), metadata=md)
            raise AssertionError("a wrong shape was accepted")
        except grpc.RpcError as e:
            shape_error = json.loads(dict(e.trailing_metadata())["triplane-error"])  # type: ignore[attr-defined]
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e  # type: ignore[attr-defined]
            assert shape_error["node"] == "y" and "client.py:1" in shape_error["message"], shape_error

        # a long job: a chain of matmuls with the identity, cancelled while it runs
        n = 1024
        ue = upload(stub, md, np.eye(n, dtype=np.float32))
        chain = {"x": input_node(ue, [n, n])}
        for i in range(60):
            chain[f"m{i}"] = node("matmul", [n, n], [f"m{i - 1}" if i else "x", "x"])
        long = submit(stub, md, chain, ["m59"])
        cancelled = stub.CancelJob(pb.CancelJobRequest(job=long.id), metadata=md)
        assert cancelled.state == "cancelled", cancelled
        ended = watch(stub, md, long.id)
        assert ended[-1].kind == "job.cancelled", [e.kind for e in ended]
        try:
            fetch(stub, md, long.id, "m59")
            raise AssertionError("fetched a tensor of a cancelled job")
        except grpc.RpcError as e:
            refused = e.code().name  # type: ignore[attr-defined]
    return {"nodes": len(nodes), "job": job.id, "kinds": [e.kind for e in events], "y_messages": y_messages,
            "max_error": float(np.abs(y - want).max()), "cancelled": long.id,
            "cancelled_kinds": [e.kind for e in ended], "fetch_cancelled": refused,
            "shape_error": shape_error}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
