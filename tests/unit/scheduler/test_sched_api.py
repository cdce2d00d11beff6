"""The REST API over a Scheduler that is not started: routes, auth, limits, error mapping.

No sockets: FastAPI's TestClient calls the app in memory; the registry is in memory and
the metadata DB is a SQLite file. Executors are simulated by registry records only, so
jobs are accepted and queued but never run here (tests/integration runs them)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from triplane import metadb as mdb
from triplane.registry import MemoryBackend, OpEngineInfo
from triplane.registry.records import encode
from triplane.scheduler.api.app import create_app
from triplane.scheduler.api.auth import check_bearer
from triplane.scheduler.api.errors import status_of
from triplane.scheduler.errors import Unauthorized
from triplane.scheduler.service import Scheduler

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make(
    tmp_path: Path, *, engines: tuple[str, ...] | None = ("exp", "add", "matmul"), max_upload: int = 1 << 20
) -> tuple[Scheduler, TestClient]:
    reg = MemoryBackend()
    if engines is not None:
        info = OpEngineInfo("ex1", "numpy", "numpy", "cpu", engines, ("float32",), 1.0, 1.0)
        asyncio.run(reg.put(info.key(), encode(info)))
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=reg, db=db, run_dir=tmp_path, secret=b"s" * 32, max_upload_bytes=max_upload)
    return s, TestClient(create_app(s, TOKEN))


def upload(c: TestClient, arr: np.ndarray) -> str:
    r = c.post(
        "/v1/tensors",
        content=arr.tobytes(),
        headers={
            **AUTH,
            "X-Triplane-Shape": ",".join(map(str, arr.shape)),
            "X-Triplane-Dtype": str(arr.dtype),
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def graph_doc(u: str, op: str = "exp") -> dict:
    return {
        "version": 1,
        "nodes": {
            "x": {
                "op": "input",
                "shape": [2, 2],
                "dtype": "float32",
                "attrs": {"tensor": u, "shape": [2, 2], "dtype": "float32"},
            },
            "y": {"op": op, "inputs": ["x"], "shape": [2, 2], "dtype": "float32"},
        },
        "outputs": ["y"],
    }


def test_health_needs_no_token_and_says_the_role(tmp_path: Path) -> None:
    _, c = make(tmp_path)
    body = c.get("/v1/health").json()
    assert body["ok"] is True and body["role"] == "leader" and body["version"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}],
)
def test_missing_or_wrong_token_is_401_with_the_error_shape(tmp_path: Path, headers: dict) -> None:
    _, c = make(tmp_path)
    for method, path in (
        ("GET", "/v1/jobs"),
        ("GET", "/v1/nodes"),
        ("POST", "/v1/jobs"),
        ("POST", "/v1/tensors"),
        ("DELETE", "/v1/jobs/j0000000000000000"),
    ):
        r = c.request(method, path, headers=headers)
        assert r.status_code == 401, (method, path)
        assert r.json()["error"]["kind"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"


def test_check_bearer_accepts_only_the_exact_token() -> None:
    check_bearer(f"Bearer {TOKEN}", TOKEN.encode())
    check_bearer(f"bearer {TOKEN}", TOKEN.encode())
    for bad in (None, "", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer"):
        with pytest.raises(Unauthorized) as e:
            check_bearer(bad, TOKEN.encode())
        assert status_of(e.value.kind) == 401


def test_upload_round_trips_and_persists_without_pickle(tmp_path: Path) -> None:
    s, c = make(tmp_path)
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    u = upload(c, arr)
    np.testing.assert_array_equal(s.store.array(u), arr)
    assert (tmp_path / "tensors" / f"{u}.npy").exists()
    np.load(tmp_path / "tensors" / f"{u}.npy", allow_pickle=False)  # readable without pickle
    from triplane.scheduler.store import TensorStore

    assert u in TensorStore(tmp_path / "tensors")  # a restarted scheduler finds it again


def test_upload_errors(tmp_path: Path) -> None:
    _, c = make(tmp_path, max_upload=1024)
    h = {**AUTH, "X-Triplane-Dtype": "float32"}
    r = c.post("/v1/tensors", content=bytes(2048), headers={**h, "X-Triplane-Shape": "512"})
    assert r.status_code == 413 and r.json()["error"]["kind"] == "too_large"
    r = c.post("/v1/tensors", content=bytes(8), headers={**h, "X-Triplane-Shape": "3"})
    assert r.status_code == 400 and "12 bytes" in r.json()["error"]["message"]
    r = c.post("/v1/tensors", content=bytes(4), headers={**h, "X-Triplane-Shape": "a,b"})
    assert r.status_code == 400
    r = c.post(
        "/v1/tensors",
        content=bytes(4),
        headers={**AUTH, "X-Triplane-Shape": "1", "X-Triplane-Dtype": "float128"},
    )
    assert r.status_code == 400 and "float128" in r.json()["error"]["message"]
    r = c.post(
        "/v1/tensors",
        content=bytes(4),
        headers={**AUTH, "X-Triplane-Shape": "", "X-Triplane-Dtype": "float32"},
    )
    assert r.status_code == 201 and r.json()["shape"] == []  # a 0-d tensor


def test_submit_queues_a_valid_job_and_reports_it(tmp_path: Path) -> None:
    s, c = make(tmp_path)
    u = upload(c, np.ones((2, 2), np.float32))
    r = c.post("/v1/jobs", json={"graph": graph_doc(u), "fetch": ["y"]}, headers=AUTH)
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    assert r.json()["state"] == "running" and job.startswith("j") and len(job) == 17
    body = c.get(f"/v1/jobs/{job}", headers=AUTH).json()
    assert body["progress"] == {"done": 0, "total": 1} and body["error"] is None
    with s.db.read() as sess:  # stored with its tasks before the answer
        assert mdb.get_job(sess, job).tasks_total == 1
    assert [j["id"] for j in c.get("/v1/jobs", headers=AUTH).json()["items"]] == [job]
    r = c.get(f"/v1/jobs/{job}/wait", params={"timeout": 0.05}, headers=AUTH)
    assert r.status_code == 200 and r.json()["state"] == "running"
    r = c.get(f"/v1/jobs/{job}/tensors/y", headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["kind"] == "not_ready"
    assert c.get(f"/v1/jobs/{job}/tensors/nope", headers=AUTH).status_code == 404


@pytest.mark.parametrize("store_first_tasks", [1000, 0])  # a small job stored first; or dispatched first
def test_a_job_the_metadb_refuses_is_503_and_leaves_nothing_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_first_tasks: int) -> None:
    import triplane.scheduler.jobs as jobs

    monkeypatch.setattr(jobs, "STORE_FIRST_TASKS", store_first_tasks)
    s, c = make(tmp_path)
    u = upload(c, np.ones((2, 2), np.float32))

    def refuse(*a: object) -> None:
        raise mdb.MetaDBError("disk full")

    monkeypatch.setattr(s.jobs, "store_job", refuse)
    r = c.post("/v1/jobs", json={"graph": graph_doc(u), "fetch": ["y"]}, headers=AUTH)
    assert r.status_code == 503, r.text
    assert "metadata DB refused the job: disk full" in r.json()["error"]["message"]
    assert s.jobs.live == {} and all(j.state != "running" for j in s.state.jobs.values())
    assert c.get("/v1/jobs", headers=AUTH).json() == {"items": [], "next": None}


def test_cancel_ends_the_job(tmp_path: Path) -> None:
    _, c = make(tmp_path)
    u = upload(c, np.ones((2, 2), np.float32))
    job = c.post("/v1/jobs", json={"graph": graph_doc(u), "fetch": ["y"]}, headers=AUTH).json()["id"]
    r = c.delete(f"/v1/jobs/{job}", headers=AUTH)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert c.get(f"/v1/jobs/{job}/wait", params={"timeout": 1}, headers=AUTH).json()["state"] == "cancelled"


def test_malformed_graph_is_400_naming_the_node_and_op(tmp_path: Path) -> None:
    _, c = make(tmp_path)
    u = upload(c, np.ones((2, 2), np.float32))
    doc = graph_doc(u)
    doc["nodes"]["y"]["shape"] = [3, 3]
    r = c.post("/v1/jobs", json={"graph": doc, "fetch": ["y"]}, headers=AUTH)
    err = r.json()["error"]
    assert r.status_code == 400 and err["node"] == "y" and err["op"] == "exp" and err["kind"] == "shape"
    doc = graph_doc(u)
    doc["nodes"]["y"]["inputs"] = ["missing"]
    assert c.post("/v1/jobs", json={"graph": doc, "fetch": ["y"]}, headers=AUTH).status_code == 400
    for body in (b"{not json", b"[]", b'{"graph": 5}', b'{"graph": {}, "fetch": "y"}', b'{"x": 1}'):
        r = c.post("/v1/jobs", content=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 400, body
        assert set(r.json()["error"]) == {"kind", "message", "node", "op"}


def test_unknown_op_and_unsupported_op_are_400(tmp_path: Path) -> None:
    _, c = make(tmp_path, engines=("exp",))
    u = upload(c, np.ones((2, 2), np.float32))
    r = c.post("/v1/jobs", json={"graph": graph_doc(u, "frobnicate"), "fetch": ["y"]}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["kind"] == "unknown_op"
    r = c.post("/v1/jobs", json={"graph": graph_doc(u, "tanh"), "fetch": ["y"]}, headers=AUTH)
    err = r.json()["error"]
    assert r.status_code == 400 and err["op"] == "tanh" and err["node"] == "y"
    assert "no registered executor engine supports op 'tanh'" in err["message"]


def test_unknown_upload_is_400_naming_the_input(tmp_path: Path) -> None:
    _, c = make(tmp_path)
    r = c.post("/v1/jobs", json={"graph": graph_doc("u-" + "0" * 32), "fetch": ["y"]}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["node"] == "x"


def test_no_executor_is_503(tmp_path: Path) -> None:
    _, c = make(tmp_path, engines=None)
    u = upload(c, np.ones((2, 2), np.float32))
    r = c.post("/v1/jobs", json={"graph": graph_doc(u), "fetch": ["y"]}, headers=AUTH)
    assert r.status_code == 503 and "no executor" in r.json()["error"]["message"]


def test_oversized_job_body_is_413(tmp_path: Path) -> None:
    s, _ = make(tmp_path)
    c = TestClient(create_app(s, TOKEN, max_graph_bytes=1000))
    r = c.post("/v1/jobs", content=b"{" + b" " * 2000 + b"}", headers=AUTH)
    assert r.status_code == 413


def test_unknown_job_is_404(tmp_path: Path) -> None:
    _, c = make(tmp_path)
    for path in (
        "/v1/jobs/j0123456789abcdef",
        "/v1/jobs/j0123456789abcdef/wait",
        "/v1/jobs/j0123456789abcdef/tensors/y",
        "/v1/jobs/bad id",
    ):
        r = c.get(path, headers=AUTH)
        assert r.status_code == 404, path
        assert r.json()["error"]["kind"] == "not_found"


def test_standby_refuses_job_routes_naming_the_leader(tmp_path: Path) -> None:
    s, c = make(tmp_path)
    s.role = "standby"
    asyncio.run(s.registry.put("scheduler/leader", b'{"id": "10.0.0.7:8470", "since": 1.0}'))
    assert c.get("/v1/health").json()["role"] == "standby"
    r = c.post("/v1/jobs", json={"graph": {}, "fetch": []}, headers=AUTH)
    assert r.status_code == 503 and "10.0.0.7:8470" in r.json()["error"]["message"]


def test_admin_reads_list_engines(tmp_path: Path) -> None:
    _, c = make(tmp_path)
    (e,) = c.get("/v1/engines", headers=AUTH).json()["items"]
    assert e["node"] == "ex1" and "exp" in e["ops"]
    assert c.get("/v1/nodes", headers=AUTH).json() == {"items": [], "next": None}


def test_a_job_deadline_reaches_the_dispatcher_and_bad_ones_are_400(tmp_path: Path) -> None:
    s, c = make(tmp_path)
    u = upload(c, np.ones((2, 2), np.float32))
    before = time.time()
    r = c.post("/v1/jobs", json={"graph": graph_doc(u), "fetch": ["y"], "deadline_s": 30}, headers=AUTH)
    assert r.status_code == 201, r.text
    deadline = s.state.jobs[r.json()["id"]].deadline  # the Tick after it fails the job (kind "deadline")
    assert deadline is not None and before + 30 <= deadline <= time.time() + 30
    for bad in (0, -1, "10", True, 1e9):
        r = c.post("/v1/jobs", json={"graph": graph_doc(u), "fetch": ["y"], "deadline_s": bad}, headers=AUTH)
        assert r.status_code == 400 and "deadline_s" in r.json()["error"]["message"], (bad, r.text)
    r = c.post("/v1/jobs", json={"graph": graph_doc(u), "fetch": ["y"], "deadline": 5}, headers=AUTH)
    assert r.status_code == 400 and "deadline_s" in r.json()["error"]["message"]  # names the known field
