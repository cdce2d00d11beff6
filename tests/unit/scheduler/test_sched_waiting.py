"""``wait_s``, ``inline`` and ``release`` on ``POST /v1/jobs`` at the front door (``api/waiting.py``):
400 naming the field, and a submit that waits answering after ``wait_s`` when its job does
not end (no executor runs it here). Values are tested on a real cluster
(tests/integration/cluster/test_cluster_refs.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_sched_auth import Cluster, job_body


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


@pytest.mark.parametrize("extra, says", [
    ({"wait_s": 0}, "'wait_s' must be seconds in (0, 60]"),
    ({"wait_s": 61}, "'wait_s'"),
    ({"wait_s": True}, "'wait_s'"),
    ({"wait_s": "1"}, "'wait_s'"),
    ({"inline": ["y"]}, "'inline' needs 'wait_s'"),
    ({"wait_s": 1, "inline": "y"}, "'inline' must be a list"),
    ({"wait_s": 1, "inline": ["x"]}, "inline[0] = 'x' is not in 'fetch'"),
    ({"release": "j1"}, "'release' must be a list of at most 1000 job or upload ids"),
    ({"release": ["j1"] * 1001}, "'release' must be a list"),
    ({"release": [3]}, "release[0] = '3' is not a job or upload id"),
    ({"release": ["j1", "../x"]}, "release[1] = '../x' is not a job or upload id"),
])
def test_a_malformed_wait_is_400_naming_the_field(cluster: Cluster, extra: dict, says: str) -> None:
    body = {**job_body(cluster.upload()), **extra}
    r = cluster.client.post("/v1/jobs", json=body, headers=cluster.headers("submit"))
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]
    headers = cluster.headers("submit")
    first = cluster.client.post("/v1/jobs", json=job_body(cluster.upload()), headers=headers)
    step = {"plan": first.json()["plan"], "args": [cluster.upload()], "fetch": ["y"], **extra}
    r = cluster.client.post("/v1/jobs", json=step, headers=cluster.headers("submit"))
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_a_submit_that_waits_answers_after_wait_s_if_the_job_runs_on(cluster: Cluster) -> None:
    t0 = time.monotonic()
    r = cluster.client.post("/v1/jobs", json={**job_body(cluster.upload()), "wait_s": 0.3, "inline": ["y"]},
                            headers=cluster.headers("submit"))
    took = time.monotonic() - t0
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["job"] == body["id"] and body["state"] == "running" and body["values"] == {}
    assert body["error"] is None and body["progress"]["total"] == 1 and len(body["plan"]) == 64
    assert 0.3 <= took < 5.0
    # without wait_s the answer is as before
    r = cluster.client.post("/v1/jobs", json=job_body(cluster.upload()), headers=cluster.headers("submit"))
    assert set(r.json()) == {"id", "state", "plan", "args"}


def test_release_frees_the_jobs_named_once_the_submit_is_answered(cluster: Cluster) -> None:
    """Both forms: the named jobs are released as DELETE releases them (a running one is
    cancelled: no executor runs it here); an unknown id is skipped; another token's job is
    403 and nothing is submitted or released."""
    alice, bob = cluster.headers("submit"), cluster.headers("bob")
    first, second, bobs = cluster.submit(), cluster.submit(), cluster.submit("bob")
    before = len(cluster.client.get("/v1/jobs", headers=alice).json()["items"])
    r = cluster.client.post("/v1/jobs", json={**job_body(cluster.upload()), "release": [first, bobs]},
                            headers=alice)
    assert r.status_code == 403 and bobs in r.json()["error"]["message"], r.text
    assert len(cluster.client.get("/v1/jobs", headers=alice).json()["items"]) == before  # none submitted
    assert cluster.client.get(f"/v1/jobs/{first}", headers=alice).json()["state"] == "running"
    r = cluster.client.post("/v1/jobs", json={**job_body(cluster.upload()), "release": [first, "j0000"]},
                            headers=alice)
    assert r.status_code == 201, r.text
    plan, new = r.json()["plan"], r.json()["id"]
    assert cluster.client.get(f"/v1/jobs/{first}", headers=alice).json()["state"] == "cancelled"
    step = {"plan": plan, "args": [cluster.upload()], "fetch": ["y"], "release": [second]}
    r = cluster.client.post("/v1/jobs", json=step, headers=alice)
    assert r.status_code == 201, r.text
    states = {j: cluster.client.get(f"/v1/jobs/{j}", headers=alice).json()["state"] for j in (second, new)}
    assert states == {second: "cancelled", new: "running"}
    assert cluster.client.get(f"/v1/jobs/{bobs}", headers=bob).json()["state"] == "running"


def test_release_frees_the_uploads_named_and_refuses_another_tokens(cluster: Cluster) -> None:
    """Uploads in ``release`` go as DELETE /v1/tensors/{id} deletes them, once the submit is
    answered (an unknown one is skipped); another token's upload is 403 and nothing is
    submitted or released."""
    alice = cluster.headers("submit")
    mine, gone, bobs = cluster.upload(), cluster.upload(), cluster.upload("bob")
    assert cluster.client.delete(f"/v1/tensors/{gone}", headers=alice).status_code == 200
    before = len(cluster.client.get("/v1/jobs", headers=alice).json()["items"])
    r = cluster.client.post("/v1/jobs", json={**job_body(cluster.upload()), "release": [mine, bobs]},
                            headers=alice)
    assert r.status_code == 403 and bobs in r.json()["error"]["message"], r.text
    assert len(cluster.client.get("/v1/jobs", headers=alice).json()["items"]) == before
    assert cluster.scheduler.store.get(mine) is not None and cluster.scheduler.store.get(bobs) is not None
    r = cluster.client.post("/v1/jobs", json={**job_body(cluster.upload()), "release": [mine, gone]},
                            headers=alice)
    assert r.status_code == 201, r.text
    assert cluster.scheduler.store.get(mine) is None and cluster.scheduler.store.get(bobs) is not None
