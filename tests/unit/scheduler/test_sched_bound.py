"""Compiled steps at the scheduler: ``POST /v1/jobs`` with ``{"plan", "args", "fetch"}``
binds new inputs to the plan of a structure submitted before (``Jobs.submit_bound``,
``api/bound.py``). No sockets: the app in memory over a Scheduler that is not started, as
in test_sched_auth.py."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from test_sched_auth import Cluster, job_body

from triplane.scheduler.api.bound import INLINE_MAX_BYTES


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def _inline(arr: np.ndarray) -> dict:
    return {"shape": list(arr.shape), "dtype": str(arr.dtype),
            "data": base64.b64encode(arr.tobytes()).decode()}


def _first(c: Cluster) -> dict:
    r = c.client.post("/v1/jobs", json=job_body(c.upload()), headers=c.headers("submit"))
    assert r.status_code == 201, r.text
    return r.json()


def test_a_submit_answers_its_plan_and_a_step_binds_new_inputs(cluster: Cluster) -> None:
    first = _first(cluster)
    assert len(first["plan"]) == 64 and len(first["args"]) == 1 and first["args"][0].startswith("u-")
    hits = cluster.scheduler.plans.hits
    for arg in (cluster.upload(), _inline(np.full((2, 2), 3, np.float32))):
        r = cluster.client.post("/v1/jobs", json={"plan": first["plan"], "args": [arg], "fetch": ["y"]},
                                headers=cluster.headers("submit"))
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        assert job != first["id"]
        assert cluster.client.get(f"/v1/jobs/{job}", headers=cluster.headers("submit")).status_code == 200
        bound = cluster.scheduler.jobs.live[job].plan.args
        assert len(bound) == 1 and bound[0] not in first["args"]
    assert cluster.scheduler.plans.hits == hits + 2  # the plan was not compiled again
    # the inline tensor became an upload holding its bytes
    np.testing.assert_array_equal(cluster.scheduler.store.array(bound[0]), np.full((2, 2), 3, np.float32))


def test_an_unknown_plan_or_another_fetch_list_is_409_unknown_plan(cluster: Cluster) -> None:
    first = _first(cluster)
    for body in ({"plan": "0" * 64, "args": [first["args"][0]], "fetch": ["y"]},
                 {"plan": first["plan"], "args": [first["args"][0]], "fetch": ["x"]}):
        r = cluster.client.post("/v1/jobs", json=body, headers=cluster.headers("submit"))
        assert r.status_code == 409, r.text
        assert r.json()["error"]["kind"] == "unknown_plan"


@pytest.mark.parametrize("args, says", [
    ([], "binds 1 inputs"),
    (["x-not-an-upload"], "not an uploaded tensor id"),
    ([{"shape": [2, 2], "dtype": "float32"}], "'shape', 'dtype', 'data'"),
    ([{"shape": [2, 2], "dtype": "float32", "data": "!!!"}], "args[0]"),
    ([{"shape": [2, 2], "dtype": "float32", "data": base64.b64encode(bytes(8)).decode()}], "16 bytes"),
    ([{"shape": [INLINE_MAX_BYTES], "dtype": "float32", "data": ""}], "upload it"),
    ([{"shape": [2, -2], "dtype": "float32", "data": ""}], "sizes >= 0"),
])
def test_a_malformed_step_is_400_naming_the_field(cluster: Cluster, args: list, says: str) -> None:
    first = _first(cluster)
    r = cluster.client.post("/v1/jobs", json={"plan": first["plan"], "args": args, "fetch": ["y"]},
                            headers=cluster.headers("submit"))
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_an_unknown_upload_in_a_step_is_refused(cluster: Cluster) -> None:
    first = _first(cluster)
    body = {"plan": first["plan"], "args": ["u-" + "0" * 32], "fetch": ["y"]}
    r = cluster.client.post("/v1/jobs", json=body, headers=cluster.headers("submit"))
    assert r.status_code == 400 and "unknown uploaded tensor" in r.json()["error"]["message"]


def test_releasing_a_step_deletes_the_inputs_it_sent_inline(cluster: Cluster) -> None:
    """An inline input is held as an upload of its job, in memory only (never a file):
    releasing the job (the SDK does once it read the results) deletes it, so a training
    loop leaves nothing behind."""
    first = _first(cluster)
    tensors = cluster.scheduler.run_dir / "tensors"
    files = lambda: sorted(p.name for p in tensors.glob("*.npy"))  # noqa: E731
    before = files()
    step = {"plan": first["plan"], "args": [_inline(np.ones((2, 2), np.float32))], "fetch": ["y"]}
    r = cluster.client.post("/v1/jobs", json=step, headers=cluster.headers("submit"))
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    (inline,) = cluster.scheduler.jobs.live[job].plan.args
    assert cluster.scheduler.store.is_held(inline) and files() == before
    assert cluster.client.delete(f"/v1/jobs/{job}", headers=cluster.headers("submit")).status_code == 200
    assert files() == before
    assert cluster.scheduler.store.get(inline) is None and not cluster.scheduler.store.is_held(inline)


def test_prefer_names_the_executor_of_a_submit_and_a_step_and_a_bad_one_is_400(cluster: Cluster) -> None:
    def nodes(r) -> set:  # type: ignore[no-untyped-def]
        assert r.status_code == 201, r.text
        return {s.node for s in cluster.scheduler.jobs.live[r.json()["id"]].plan.specs}

    post, submit = cluster.client.post, cluster.headers("submit")
    r = post("/v1/jobs", json={**job_body(cluster.upload()), "prefer": "exec-b"}, headers=submit)
    assert nodes(r) == {"exec-b"}
    step = {"plan": r.json()["plan"], "args": [cluster.upload()], "fetch": ["y"]}
    assert nodes(post("/v1/jobs", json=step, headers=submit)) == {None}  # the dispatcher places it
    assert nodes(post("/v1/jobs", json={**step, "prefer": "exec-a"}, headers=submit)) == {"exec-a"}
    for bad in ("", "a/b", 7, "x" * 129):
        for doc in ({**job_body(cluster.upload()), "prefer": bad}, {**step, "prefer": bad}):
            r = post("/v1/jobs", json=doc, headers=submit)
            assert r.status_code == 400, r.text
            assert "'prefer' must be an executor's name" in r.json()["error"]["message"]
