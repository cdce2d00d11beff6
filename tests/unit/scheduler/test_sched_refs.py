"""Refs at the front door and in the scheduler without executors (``scheduler/refs.py``):
the ref syntax, where a graph or a compiled step names refs, and the 4xx of a ref that
cannot be used (unknown job, a name it did not fetch, a job still running), each naming
the ref. Values read where they live are tested on a real cluster
(tests/integration/cluster/test_cluster_refs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sched_auth import Cluster, job_body

from triplane.scheduler.api.bound import parse_bound_request
from triplane.scheduler.errors import BadRequest
from triplane.scheduler.refs import parse_ref, refs_in_args, refs_in_graph

JOB = "j0123456789abcdef"


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


@pytest.mark.parametrize("s, want", [
    (f"{JOB}:n17", (JOB, "n17")),
    (f"{JOB}:a:b", (JOB, "a:b")),  # the name is everything after the first colon
    (f"{JOB}:", None),
    (f"{JOB}n17", None),
    ("j0123:n1", None),
    (f"{JOB.upper()}:y", None),
    (f"{JOB}:a/b", None),
    ("u-" + "0" * 32, None),
    (f"{JOB}:" + "x" * 129, None),
    (17, None),
])
def test_parse_ref(s: object, want: object) -> None:
    assert parse_ref(s) == want


def test_refs_named_by_a_graph_and_by_a_step() -> None:
    doc = job_body(f"{JOB}:y")["graph"]
    doc["nodes"]["q"] = {"op": "input", "attrs": {"tensor": "u-" + "0" * 32}}
    doc["nodes"]["r"] = {"op": "input", "attrs": {"tensor": f"{JOB}:y"}}  # the same ref twice: once
    assert refs_in_graph(doc) == [f"{JOB}:y"]
    assert refs_in_graph({"nodes": []}) == [] and refs_in_graph("x") == []
    args = ["u-1", f"{JOB}:y", {"shape": []}, f"{JOB}:z", f"{JOB}:y"]
    assert refs_in_args(args) == [f"{JOB}:y", f"{JOB}:z"]
    req = parse_bound_request({"plan": "ab12", "args": [f"{JOB}:y"], "fetch": ["z"]})
    assert req.args == [f"{JOB}:y"]
    with pytest.raises(BadRequest, match=r"args\[0\].*not an uploaded tensor id or a ref"):
        parse_bound_request({"plan": "ab12", "args": [f"{JOB}/y"], "fetch": ["z"]})


def _ref_error(c: Cluster, ref: str, status: int) -> dict:
    r = c.client.post("/v1/jobs", json=job_body(ref), headers=c.headers("admin"))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["ref"] == ref and ref in err["message"], err
    return err


def test_unknown_unfetched_and_unfinished_refs_are_refused_naming_the_ref(cluster: Cluster) -> None:
    assert _ref_error(cluster, f"{JOB}:y", 404)["kind"] == "not_found"
    running = cluster.submit("admin")  # no executor runs it: it stays running
    assert _ref_error(cluster, f"{running}:y", 409)["kind"] == "not_ready"
    assert _ref_error(cluster, f"{running}:x", 404)["kind"] == "not_found"  # not fetched
    first = cluster.client.post("/v1/jobs", json=job_body(cluster.upload()), headers=cluster.headers("admin"))
    r = cluster.client.post("/v1/jobs", json={"plan": first.json()["plan"], "args": [f"{running}:y"],
                                              "fetch": ["y"]}, headers=cluster.headers("admin"))
    assert r.status_code == 409 and r.json()["error"]["ref"] == f"{running}:y", r.text
    assert not cluster.scheduler.results._pins  # nothing stays pinned by a refused submit


def test_a_job_tile_id_given_as_an_input_is_refused(cluster: Cluster) -> None:
    running = cluster.submit("admin")
    r = cluster.client.post("/v1/jobs", json=job_body(f"{running}.n1"), headers=cluster.headers("admin"))
    assert r.status_code == 400 and "unknown uploaded tensor" in r.json()["error"]["message"], r.text


def test_a_submit_token_uses_refs_to_its_own_jobs_only(cluster: Cluster) -> None:
    bobs = cluster.submit("bob")
    r = cluster.client.post("/v1/jobs", json=job_body(f"{bobs}:y"), headers=cluster.headers("submit"))
    assert r.status_code == 403 and r.json()["error"]["kind"] == "forbidden", r.text
    r = cluster.client.post("/v1/jobs", json=job_body(f"{bobs}:y"), headers=cluster.headers("bob"))
    assert r.status_code == 409, r.text  # bob's own: allowed (still running)
