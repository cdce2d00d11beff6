"""Refs at the front door and in the scheduler without executors (``scheduler/refs.py``):
the ref syntax, where a graph or a compiled step names refs, and the 4xx of a ref that
cannot be used (unknown job, a name it did not fetch, a job still running), each naming
the ref. Values read where they live are tested on a real cluster
(tests/integration/cluster/test_cluster_refs.py)."""

from __future__ import annotations

import time
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
    first = cluster.client.post("/v1/jobs", json=job_body(cluster.upload("submit")),
                                headers=cluster.headers("submit")).json()
    step = {"plan": first["plan"], "args": [cluster.upload("submit")], "fetch": ["y"]}
    r = cluster.client.post("/v1/jobs", json={**step, "inline_refs": [f"{bobs}:y"]},
                            headers=cluster.headers("submit"))
    assert r.status_code == 403 and bobs in r.json()["error"]["message"], r.text  # nor its values


@pytest.mark.parametrize("body, says", [
    ({"form": []}, 'expected {"from": [ref, ...]}'),
    ({"from": "x"}, "'from' must be a list of at most 1000 refs"),
    ({"from": [f"{JOB}:y"] * 1001}, "at most 1000"),
    ({"from": [f"{JOB}:y", "u-" + "0" * 32]}, "from[1] = 'u-000"),
])
def test_a_malformed_copy_is_400_naming_the_field(cluster: Cluster, body: dict, says: str) -> None:
    r = cluster.client.post("/v1/tensors/copy", json=body, headers=cluster.headers("submit"))
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_copy_errors_as_refs_and_only_of_ones_own_jobs(cluster: Cluster) -> None:
    running = cluster.submit("submit")  # alice's
    for ref, status, kind in ((f"{JOB}:y", 404, "not_found"), (f"{running}:y", 409, "not_ready"),
                              (f"{running}:x", 404, "not_found")):
        r = cluster.client.post("/v1/tensors/copy", json={"from": [ref]}, headers=cluster.headers("submit"))
        assert r.status_code == status and r.json()["error"] | {"kind": kind, "ref": ref} == r.json()["error"]
    bobs = cluster.headers("bob")
    r = cluster.client.post("/v1/tensors/copy", json={"from": [f"{running}:y"]}, headers=bobs)
    assert r.status_code == 403, r.text


# --- the pure pieces: binding, placement preference, packets ---------------------------------

def _plan_reading(tile: str):
    from triplane.proto.ir import Graph
    from triplane.scheduler.compiler.compile import compile_job
    from triplane.scheduler.compiler.pipeline import PlanCache

    g = Graph.from_dict(job_body(f"{JOB}:y")["graph"])
    return compile_job(g, ["y"], cache=PlanCache(), bind={f"{JOB}:y": tile})


def test_a_ref_binds_its_tile_and_its_readers_prefer_the_holder() -> None:
    from triplane.scheduler.refs import Held, Refs, Resolved

    tile = f"{JOB}.n1"
    plan = _plan_reading(tile)
    assert plan.args == (tile,) and [t.uploads for t in plan.templates.values()] == [(tile,)]
    held = Held({f"{JOB}:y": Resolved(f"{JOB}:y", tile, "ex2", JOB, (2, 2), "float32")})
    assert [s.node for s in Refs.prefer_holders(plan, held).specs] == ["ex2"]
    Refs.check_types(plan, held)  # float32[2, 2]: as declared
    wrong = Held({f"{JOB}:y": Resolved(f"{JOB}:y", tile, "ex2", JOB, (2, 3), "float32")})
    with pytest.raises(BadRequest, match=r"ref j0123456789abcdef:y is float32\[2, 3\], the input 'x'"):
        Refs.check_types(plan, wrong)


def test_placement_sees_a_ref_held_where_it_lives() -> None:
    from triplane.scheduler.compiler.compile import ClusterSnapshot
    from triplane.scheduler.refs import Held, Refs, Resolved

    tile = f"{JOB}.t3"
    parts = (((0, 2), (0, 4)), f"{JOB}.t3", "ex1"), (((2, 4), (0, 4)), f"{JOB}.t5", "ex2")
    held = Held({f"{JOB}:y": Resolved(f"{JOB}:y", tile, "ex1", JOB, (4, 4), "float32", parts)})
    at = Refs.snapshot(ClusterSnapshot(), held).cached([tile, "u-" + "0" * 32])  # type: ignore[misc]
    assert at("arg0", ((2, 4), (0, 4))) == ("ex2",) and at("arg0", ((1, 3), (0, 4))) == ()
    assert at("arg0", None) == () and at("arg1", None) == ()


def test_regions_of_a_tiled_ref_that_are_its_tiles_read_them_others_need_a_copy() -> None:
    import dataclasses

    from triplane.scheduler.refs import Held, Refs, Resolved

    tile = f"{JOB}.t3"
    plan = _plan_reading(tile)
    parts = (((0, 1), (0, 2)), f"{JOB}.t3", "ex1"), (((1, 2), (0, 2)), f"{JOB}.t5", "ex2")
    held = Held({f"{JOB}:y": Resolved(f"{JOB}:y", tile, "ex1", JOB, (2, 2), "float32", parts)})
    (task, tpl), = plan.templates.items()
    region = dataclasses.replace(plan, templates={task: dataclasses.replace(
        tpl, inputs=(f"{tile}@1:2,0:2",), uploads=(f"{tile}@1:2,0:2",))})
    bound, copy = Refs.bind_regions(region, held)
    assert copy == [] and bound.templates[task].inputs == (f"{JOB}.t5",) == bound.templates[task].uploads
    other = dataclasses.replace(plan, templates={task: dataclasses.replace(
        tpl, inputs=(f"{tile}@0:2,0:1",), uploads=(f"{tile}@0:2,0:1",))})
    assert Refs.bind_regions(other, held)[1] == [f"{JOB}:y"]  # no tile is that region
    assert Refs.bind_regions(plan, held)[1] == [f"{JOB}:y"]  # a whole read of a tiled value


def test_a_task_packet_names_the_holder_of_a_ref_tile() -> None:
    from triplane.proto.ir import TensorType
    from triplane.proto.packet import decode
    from triplane.scheduler.compiler.jobplan import TaskTemplate
    from triplane.scheduler.dispatch.shell import DispatchShell
    from triplane.scheduler.dispatch.state import DispatchState, Send

    tile, upload = f"{JOB}.n1", "u-" + "0" * 32
    tpl = TaskTemplate("add", (tile, upload), (tile, upload), {}, TensorType((2, 2), "float32"))
    shell = DispatchShell(DispatchState(), b"s" * 32, {"j1": {"n0": tpl}})
    shell.sources[tile] = "ex2"
    p = decode(shell.packet_for(Send("j1", "n0", 0, "ex1", time.time() + 60, ())), b"s" * 32)
    assert p.pull_from == {tile: "ex2", upload: "scheduler"}


def test_a_job_reading_a_tiled_ref_reads_only_its_tiles_and_is_planned_again_the_same() -> None:
    from triplane.proto.ir import Graph
    from triplane.scheduler.compiler import PlanCache
    from triplane.scheduler.compiler.compile import ClusterSnapshot, compile_job
    from triplane.scheduler.compiler.costmodel import NodeFigures
    from triplane.scheduler.earlier import plan_again
    from triplane.scheduler.jobrecords import bindings_of
    from triplane.scheduler.refs import Held, Refs, Resolved

    n, tile, c = 1024, f"{JOB}.t3", "u-" + "0" * 32
    parts = (((0, 512), (0, n)), tile, "ex1"), (((512, n), (0, n)), f"{JOB}.t5", "ex2")
    held = Held({f"{JOB}:y": Resolved(f"{JOB}:y", tile, "ex1", JOB, (n, n), "float32", parts)})
    assert Refs.held_cuts([c, tile], held) == {"arg1": [[0, 512, n], [0, n]]}

    def inp(t: str) -> dict[str, object]:
        return {"op": "input", "shape": [n, n], "dtype": "float32",
                "attrs": {"tensor": t, "shape": [n, n], "dtype": "float32"}}

    g = Graph.from_dict({"version": 1, "nodes": {  # z = c @ p: each row strip of z reads p whole
        "c": inp(c), "p": inp(tile), "z": {"op": "matmul", "inputs": ["c", "p"], "shape": [n, n],
                                          "dtype": "float32"}}, "outputs": ["z"]})
    figs = ClusterSnapshot(tuple(NodeFigures(f"ex{i}", 50.0, 10.0, 256 << 20) for i in (1, 2)),
                           whole_s=0)  # cut, as a job too big to keep whole is
    jp = compile_job(g, ["z"], Refs.snapshot(figs, held), cache=PlanCache(), job="j" + "1" * 16)
    read = {u for t in jp.templates.values() for u in t.uploads if u.startswith(JOB)}
    assert read == {f"{tile}@0:512,0:{n}", f"{tile}@512:{n},0:{n}"}, read  # its tiles, nothing else
    bound, copy = Refs.bind_regions(jp, held)
    assert copy == [] and {u for t in bound.templates.values() for u in t.uploads if u.startswith(JOB)} == \
        {tile, f"{JOB}.t5"}
    bindings = {**bindings_of(jp), "held": Refs.held_cuts(jp.args, held)}
    again = plan_again(jp.job, jp.graph, bindings, PlanCache())  # a restarted scheduler
    assert again.templates == jp.templates


def test_a_compiled_step_awaits_the_job_whose_outputs_it_binds(cluster: Cluster) -> None:
    """``await_refs_s`` (a pipelined step): a ref to a running job waits up to that long for
    its end instead of 409 at once; the wait ends when the job does (here: cancelled, so the
    ref is refused naming it); out of [0, 60] is a 400."""
    with cluster.client:  # one event loop for every request (the scheduler's, as in production)
        _await_refs(cluster)


def _await_refs(cluster: Cluster) -> None:
    import threading

    admin = cluster.headers("admin")
    running = cluster.submit("admin")  # no executor runs it: it stays running
    first = cluster.client.post("/v1/jobs", json=job_body(cluster.upload("admin")), headers=admin).json()
    step = {"plan": first["plan"], "args": [f"{running}:y"], "fetch": ["y"]}
    r = cluster.client.post("/v1/jobs", json=step, headers=admin)
    assert r.status_code == 409 and r.json()["error"]["kind"] == "not_ready", r.text
    t0 = time.monotonic()
    r = cluster.client.post("/v1/jobs", json={**step, "await_refs_s": 0.3}, headers=admin)
    assert r.status_code == 409 and r.json()["error"]["kind"] == "not_ready", r.text
    assert time.monotonic() - t0 >= 0.3
    cancel = threading.Timer(0.3, lambda: cluster.client.delete(f"/v1/jobs/{running}", headers=admin))
    cancel.start()
    t0 = time.monotonic()
    r = cluster.client.post("/v1/jobs", json={**step, "await_refs_s": 30}, headers=admin)
    cancel.join()
    assert time.monotonic() - t0 < 10, "the wait did not end with the job"
    assert r.status_code == 404 and running in r.json()["error"]["message"], r.text
    for bad in (-1, 61, "1", None):
        r = cluster.client.post("/v1/jobs", json={**step, "await_refs_s": bad}, headers=admin)
        assert r.status_code == 400 and "await_refs_s" in r.json()["error"]["message"], (bad, r.text)
