"""POST /v1/jobs with a graph that leaves out shapes and dtypes, nodes carrying ``loc``, and a
``grad`` request (proto/infer.py, proto/autograd.py): the scheduler infers the types,
appends the gradients as ``grad:<w>`` and fetches them; each mistake is a 400 naming it.

In memory (FastAPI's TestClient) over a Scheduler that is not started, as
test_sched_bad_input.py: jobs are accepted and planned, not run (the cluster test
tests/integration/cluster/test_cluster_wire_grad.py runs them)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from triplane import metadb as mdb
from triplane.proto import optable
from triplane.registry import MemoryBackend, OpEngineInfo
from triplane.registry.records import encode
from triplane.scheduler.api.app import create_app
from triplane.scheduler.service import Scheduler

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(tmp_path: Path) -> tuple[Scheduler, TestClient]:
    reg = MemoryBackend()
    info = OpEngineInfo("ex1", "numpy", "numpy", "cpu", tuple(optable.names()), ("float32",), 1.0, 1.0)
    asyncio.run(reg.put(info.key(), encode(info)))
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=reg, db=db, run_dir=tmp_path, secret=b"s" * 32)
    return s, TestClient(create_app(s, TOKEN), raise_server_exceptions=False)


@pytest.fixture
def client(api: tuple[Scheduler, TestClient]) -> TestClient:
    return api[1]


def _upload(c: TestClient, shape: tuple[int, ...]) -> str:
    r = c.post("/v1/tensors", content=np.ones(shape, np.float32).tobytes(),
               headers={**AUTH, "X-Triplane-Shape": ",".join(map(str, shape)), "X-Triplane-Dtype": "float32"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _graph(x: str, w: str, w_loc: str = "train.go:12") -> dict[str, Any]:
    return {"nodes": {
        "x": {"op": "input", "attrs": {"tensor": x}, "loc": "train.go:10"},
        "w": {"op": "input", "attrs": {"tensor": w}, "loc": "train.go:11"},
        "y": {"op": "matmul", "inputs": ["x", "w"], "loc": w_loc},
        "loss": {"op": "mean", "inputs": ["y"], "loc": "train.go:13"}}, "outputs": ["loss"]}


GRAD_W = {"of": "loss", "wrt": ["w"]}


def test_an_untyped_graph_with_a_grad_request_is_accepted_and_fetches_the_gradient(
        api: tuple[Scheduler, TestClient]) -> None:
    s, client = api
    x, w = _upload(client, (4, 3)), _upload(client, (3, 2))
    r = client.post("/v1/jobs", headers=AUTH, json={"graph": _graph(x, w), "grad": GRAD_W})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    assert client.get(f"/v1/jobs/{job}", headers=AUTH).json()["state"] in ("queued", "running")
    with s.db.read() as session:
        assert mdb.get_job(session, job).fetch == ("loss", "grad:w")  # the gradient joins the fetch list
    # the same graph typed in full is the same structure: the same canonical plan
    typed = _graph(x, w)
    for nid, shape in {"x": [4, 3], "w": [3, 2], "y": [4, 2], "loss": []}.items():
        typed["nodes"][nid] = {**typed["nodes"][nid], "shape": shape, "dtype": "float32"}
        typed["nodes"][nid].pop("loc")
        if nid in "xw":
            typed["nodes"][nid]["attrs"] = {**typed["nodes"][nid]["attrs"], "shape": shape}
    r2 = client.post("/v1/jobs", headers=AUTH, json={"graph": typed, "grad": GRAD_W, "fetch": ["loss"]})
    assert r2.status_code == 201, r2.text
    assert r2.json()["plan"] == r.json()["plan"]


def test_a_wrong_shape_is_400_naming_the_node_op_shapes_and_loc(client: TestClient) -> None:
    x, w = _upload(client, (4, 3)), _upload(client, (5, 2))
    r = client.post("/v1/jobs", headers=AUTH, json={"graph": _graph(x, w), "grad": GRAD_W})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["kind"], err["node"], err["op"]) == ("shape", "y", "matmul")
    assert "(at train.go:12)" in err["message"] and "float32[4, 3], float32[5, 2]" in err["message"]


@pytest.mark.parametrize(("grad", "kind", "words"), [
    ({"of": "loss", "wrt": ["nope"]}, "graph", "'nope', which is not a node"),
    ({"of": "y", "wrt": ["w"]}, "not_differentiable", "non-scalar"),
    ({"of": "loss"}, "graph", "'grad' must be"),
    ({"of": "loss", "wrt": ["w/1"]}, "graph", "grad.wrt[0]"),
])
def test_a_bad_grad_request_is_400_with_its_kind(client: TestClient, grad: Any, kind: str,
                                                 words: str) -> None:
    x, w = _upload(client, (4, 3)), _upload(client, (3, 2))
    r = client.post("/v1/jobs", headers=AUTH, json={"graph": _graph(x, w), "grad": grad})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["kind"] == kind and words in err["message"], err


def test_an_input_of_an_unknown_upload_without_a_shape_is_400_naming_it(client: TestClient) -> None:
    w = _upload(client, (3, 2))
    r = client.post("/v1/jobs", headers=AUTH, json={"graph": _graph("u-missing", w)})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["node"] == "x" and "'u-missing' is not a known upload" in err["message"]
    assert "(at train.go:10)" in err["message"]
