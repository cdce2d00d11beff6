"""The gRPC front door of a live local cluster (docs/grpc.md): ``triplane up``'s scheduler
serves it beside REST, records its address in the ready file and ``cluster.json``, and a
client in another process (grpc_client.py, the generated stubs alone) submits, watches,
uploads, fetches and cancels with a submit token; the values equal numpy's (a graph with
no shapes and a gradient request too: the REST API's front door)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc

from triplane.scheduler.api.tokens import add_token
from triplane.scheduler.grpc import triplane_pb2 as pb
from triplane.scheduler.grpc import triplane_pb2_grpc as pb_grpc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
ENV = {**os.environ, "PYTHONPATH": PYTHONPATH, "TRIPLANE_TOKEN": "t" * 32}


def test_a_grpc_client_process_submits_watches_uploads_fetches_and_cancels(start_cluster: Any) -> None:
    with start_cluster(bound_s=240.0, executors=2) as c:
        recorded = json.loads(c.run.cluster_file.read_text())
        host, port = recorded["grpc"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0 and recorded["grpc"] == c.grpc
        assert json.loads(c.ready_file.read_text())["grpc"] == c.grpc
        token = add_token(c.run.tokens_file, "grpc-client", "submit")
        env = {**ENV, "TRIPLANE_TOKEN": token}
        r = subprocess.run([sys.executable, str(HERE / "grpc_client.py"), c.grpc], env=env,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, f"the client failed:\n{r.stdout}\n{r.stderr[-4000:]}"
        seen = json.loads(r.stdout.strip().splitlines()[-1])
        assert seen["nodes"] == 2
        assert seen["kinds"][0] == "job.submitted" and seen["kinds"][-1] == "job.done", seen
        assert seen["y_messages"] >= 2  # 1.7 MB came in 1 MiB messages
        assert seen["max_error"] < 1e-4
        assert seen["cancelled_kinds"][-1] == "job.cancelled"
        assert seen["shape_error"]["kind"] == "shape" and seen["shape_error"]["op"] == "matmul"
        assert seen["fetch_cancelled"] in ("NOT_FOUND", "FAILED_PRECONDITION"), seen
        with grpc.insecure_channel(c.grpc) as channel:  # the jobs are the token's: another sees none
            stub = pb_grpc.TriplaneStub(channel)
            other = add_token(c.run.tokens_file, "someone-else", "submit")
            try:
                stub.GetJob(pb.GetJobRequest(job=seen["job"]),
                            metadata=[("authorization", f"Bearer {other}")])
                raise AssertionError("a submit token read another's job")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
            job = stub.GetJob(pb.GetJobRequest(job=seen["job"]),
                              metadata=[("authorization", f"Bearer {c.token}")])  # the admin's
            assert job.state == "done" and json.loads(job.json)["id"] == seen["job"]


def test_a_grpc_port_in_use_or_out_of_range_is_refused(tmp_path: Path) -> None:
    """Exit status 2 and one line naming the port: no SO_REUSEPORT sharing of a busy port."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for value, said in ((str(port), f"cannot listen for gRPC on 127.0.0.1:{port}"),
                            ("70000", "--grpc-port must be in 0..65535")):
            r = subprocess.run([sys.executable, "-m", "triplane", "scheduler", "--port", "0",
                                "--grpc-port", value, "--run-dir", str(tmp_path / value)],
                               env=ENV, capture_output=True, text=True, timeout=60)
            assert r.returncode == 2 and said in r.stderr, (r.returncode, r.stderr[-2000:])
    finally:
        taken.close()
