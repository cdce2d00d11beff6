"""Refs on a real local cluster (issue 12, "resident parameters"; docs/runtime.md, "Refs"):
a done job's fetched output bound as an input of the next job, in a full submit and in a
compiled step, read where it lives; the errors of an unknown, released, unfinished or
mistyped ref; a release while a reader runs; a holder SIGKILLed (410 ``lost`` at submit,
job error ``lost`` while running)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cluster_memory import settled_free
from cluster_run import running_cluster

from triplane.launcher import ClusterConfig, LocalCluster
from triplane.scheduler.compiler.group import MAX_GROUP_TASKS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # --whole-s 0: every job over 4 MiB is cut, as the tiled-ref tests here need (a job this
    # small would otherwise run uncut on one executor: compiler/layout.py, stays_whole)
    with running_cluster(tmp_path_factory.mktemp("refs"), bound_s=900.0, executors=2,
                         scheduler_args=["--whole-s", "0"]) as c:
        yield c


def api(c: LocalCluster) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.token}"}, timeout=30.0)


def upload(h: httpx.Client, arr: np.ndarray) -> str:
    r = h.post("/v1/tensors", content=arr.tobytes(), headers={
        "X-Triplane-Shape": ",".join(map(str, arr.shape)), "X-Triplane-Dtype": str(arr.dtype)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def inp(tensor: str, shape: list[int], dtype: str = "float32") -> dict[str, Any]:
    return {"op": "input", "shape": shape, "dtype": dtype,
            "attrs": {"tensor": tensor, "shape": shape, "dtype": dtype}}


def op(name: str, inputs: list[str], shape: list[int], **attrs: Any) -> dict[str, Any]:
    return {"op": name, "inputs": inputs, "shape": shape, "dtype": "float32", "attrs": attrs}


def submit(h: httpx.Client, nodes: dict[str, Any], fetch: list[str], status: int = 201,
           **extra: Any) -> dict[str, Any]:
    r = h.post("/v1/jobs", json={"graph": {"version": 1, "nodes": nodes, "outputs": fetch},
                                 "fetch": fetch, **extra})
    assert r.status_code == status, r.text
    return r.json()


def wait_done(h: httpx.Client, job: str, state: str = "done") -> dict[str, Any]:
    body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 60}).json()
    assert body["state"] == state, body
    return body


def fetch(h: httpx.Client, job: str, name: str) -> np.ndarray:
    r = h.get(f"/v1/jobs/{job}/tensors/{name}")
    assert r.status_code == 200, r.text
    shape = tuple(int(d) for d in r.headers["x-triplane-shape"].split(",") if d)
    return np.frombuffer(r.content, np.float32).reshape(shape)


def double(ref: str, shape: list[int]) -> dict[str, Any]:
    return {"p": inp(ref, shape), "z": op("add", ["p", "p"], shape)}


def _exp_then_double(h: httpx.Client) -> tuple[np.ndarray, str, str, dict[str, Any]]:
    """x, its upload, job j1 = exp(x) (done), and the submit of 2 * j1:y (its answer)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    u = upload(h, x)
    j1 = submit(h, {"x": inp(u, [3, 4]), "y": op("exp", ["x"], [3, 4])}, ["y"])["id"]
    wait_done(h, j1)
    return x, u, j1, submit(h, double(f"{j1}:y", [3, 4]), ["z"])


def test_a_chain_of_refs_in_full_submits_and_compiled_steps_equals_numpy(cluster: LocalCluster) -> None:
    with api(cluster) as h:
        x, u, j1, first = _exp_then_double(h)
        assert first["args"] == [f"{j1}:y"]
        wait_done(h, first["id"])
        want = np.exp(x) * 2
        np.testing.assert_allclose(fetch(h, first["id"], "z"), want, rtol=1e-6)
        prev = first["id"]
        for _ in range(3):  # compiled steps, each reading the previous step's output
            r = h.post("/v1/jobs", json={"plan": first["plan"], "args": [f"{prev}:z"], "fetch": ["z"]})
            assert r.status_code == 201, r.text
            prev = r.json()["id"]
            wait_done(h, prev)
            want = want * 2
        np.testing.assert_allclose(fetch(h, prev, "z"), want, rtol=1e-6)
        # a ref mixed with an upload, in one graph
        nodes = {"p": inp(f"{prev}:z", [3, 4]), "x": inp(u, [3, 4]), "s": op("add", ["p", "x"], [3, 4])}
        j = submit(h, nodes, ["s"])["id"]
        wait_done(h, j)
        np.testing.assert_allclose(fetch(h, j, "s"), want + x, rtol=1e-6)
        # an input bound to a ref, fetched as it is, and used as a ref again
        j = submit(h, {**double(f"{prev}:z", [3, 4])}, ["p", "z"])["id"]
        wait_done(h, j)
        np.testing.assert_allclose(fetch(h, j, "p"), want, rtol=1e-6)
        k = submit(h, double(f"{j}:p", [3, 4]), ["z"])["id"]
        wait_done(h, k)
        np.testing.assert_allclose(fetch(h, k, "z"), want * 2, rtol=1e-6)


def test_a_pipelined_step_awaits_the_step_before_and_carries_its_values(cluster: LocalCluster) -> None:
    """The pipelined steps' contract (docs/runtime.md "Pipelined steps"): each compiled step
    is submitted while the one before may still run, binds its output with await_refs_s,
    and names that output in inline_refs; the answer's ref_values hold its value."""
    import base64

    with api(cluster) as h:
        x, _, _, first = _exp_then_double(h)
        prev, want = first["id"], np.exp(x) * 2
        for _ in range(4):  # never waited for by the client
            r = h.post("/v1/jobs", json={"plan": first["plan"], "args": [f"{prev}:z"], "fetch": ["z"],
                                         "await_refs_s": 30, "inline_refs": [f"{prev}:z"]})
            assert r.status_code == 201, r.text
            got = r.json()["ref_values"][f"{prev}:z"]
            assert got["shape"] == [3, 4] and got["dtype"] == "float32", got
            value = np.frombuffer(base64.b64decode(got["data"]), "<f4").reshape(3, 4)
            np.testing.assert_allclose(value, want, rtol=1e-6)
            prev, want = r.json()["id"], want * 2
        wait_done(h, prev)
        np.testing.assert_allclose(fetch(h, prev, "z"), want, rtol=1e-6)
        for bad in ("x", ["not a ref"], [f"{prev}:z"] * 65):
            r = h.post("/v1/jobs", json={"plan": first["plan"], "args": [f"{prev}:z"], "fetch": ["z"],
                                         "inline_refs": bad})
            assert r.status_code == 400 and "inline_refs" in r.json()["error"]["message"], (bad, r.text)


def test_ref_errors_name_the_ref(cluster: LocalCluster) -> None:
    with api(cluster) as h:
        u = upload(h, np.ones((3, 4), np.float32))
        j1 = submit(h, {"x": inp(u, [3, 4]), "y": op("exp", ["x"], [3, 4])}, ["y"])["id"]
        wait_done(h, j1)
        cases = [
            (f"j{'0' * 16}:y", [3, 4], 404, "not_found"),  # unknown job
            (f"{j1}:nope", [3, 4], 404, "not_found"),  # a name the job did not fetch
            (f"{j1}:y", [4, 3], 400, "request"),  # the input declares another type
        ]
        for ref, shape, status, kind in cases:
            err = submit(h, double(ref, shape), ["z"], status)["error"]
            assert err["kind"] == kind and err["ref"] == ref and ref in err["message"], err
        # compiled step: same errors
        first = submit(h, double(f"{j1}:y", [3, 4]), ["z"])
        r = h.post("/v1/jobs", json={"plan": first["plan"], "args": [f"{j1}:nope"], "fetch": ["z"]})
        assert r.status_code == 404 and r.json()["error"]["ref"] == f"{j1}:nope", r.text
        r = h.post("/v1/jobs", json={"plan": first["plan"], "args": ["not a ref"], "fetch": ["z"]})
        assert r.status_code == 400 and "args[0]" in r.json()["error"]["message"], r.text
        # released: 404
        wait_done(h, first["id"])
        assert h.delete(f"/v1/jobs/{j1}").status_code == 200
        err = submit(h, double(f"{j1}:y", [3, 4]), ["z"], 404)["error"]
        assert err["kind"] == "not_found" and "released" in err["message"], err


def long_chain(ref: str, w: str, n: int, depth: int) -> dict[str, Any]:
    nodes: dict[str, Any] = {"p": inp(ref, [n, n]), "w": inp(w, [n, n])}
    last = "p"
    for i in range(depth):
        nodes[f"m{i}"] = op("matmul", [last, "w"], [n, n])
        nodes[f"h{i}"] = op("tanh", [f"m{i}"], [n, n])
        last = f"h{i}"
    nodes["out"] = op("add", [last, "p"], [n, n])
    return nodes


def test_not_ready_and_a_release_while_a_reader_runs(cluster: LocalCluster) -> None:
    n = 512
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = (rng.standard_normal((n, n), dtype=np.float32) * 0.05).astype(np.float32)
    with api(cluster) as h:
        ux, uw = upload(h, x), upload(h, w)
        j1 = submit(h, {"x": inp(ux, [n, n]), "y": op("exp", ["x"], [n, n])}, ["y"])["id"]
        # j2 reads j1's output while j1 may still run: 409 not_ready (or it is done already)
        r = h.post("/v1/jobs", json={"graph": {"version": 1, "nodes": double(f"{j1}:y", [n, n]),
                                               "outputs": ["z"]}, "fetch": ["z"]})
        assert r.status_code in (201, 409), r.text
        if r.status_code == 409:
            assert r.json()["error"]["kind"] == "not_ready"
        wait_done(h, j1)
        j2 = submit(h, long_chain(f"{j1}:y", uw, n, 30), ["out"])["id"]
        assert h.delete(f"/v1/jobs/{j1}").json()["id"] == j1  # released while j2 reads it
        wait_done(h, j2)
        want = np.exp(x)
        p = want
        for _ in range(30):
            want = np.tanh(want @ w)
        np.testing.assert_allclose(fetch(h, j2, "out"), want + p, rtol=1e-3, atol=1e-4)


def test_holder_sigkilled_lost_while_running_and_at_submit(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("uvicorn", reason="the cluster extra is not installed")
    c = LocalCluster(tmp_path_factory.mktemp("refs-lost"), ClusterConfig(executors=1, memory="256MiB",
                                                                         ready_timeout_s=60.0))
    # a chain of 301 small tasks: under 4 MiB in all, so not cut into tiles (p is read whole), and
    # over MAX_GROUP_TASKS, so not one grouped task that could end before the kill
    n = 48
    rng = np.random.default_rng(1)
    try:
        c.start()
        with api(c) as h:
            ux = upload(h, rng.standard_normal((n, n), dtype=np.float32))
            uw = upload(h, (rng.standard_normal((n, n), dtype=np.float32) * 0.05).astype(np.float32))
            j1 = submit(h, {"x": inp(ux, [n, n]), "y": op("exp", ["x"], [n, n])}, ["y"])["id"]
            wait_done(h, j1)  # held by executor-0, the only one
            c.add_executor()
            depth = MAX_GROUP_TASKS // 2 + 22  # two tasks a step
            j2 = submit(h, long_chain(f"{j1}:y", uw, n, depth), ["out"])["id"]  # its last task reads p
            c.kill_executor(0)
            body = wait_done(h, j2, "failed")
            assert body["error"]["kind"] == "lost" and body["error"]["ref"] == f"{j1}:y", body
            assert f"{j1}:y" in body["error"]["message"]
            # Its input released, the value cannot be computed again from lineage (lineage.py):
            # once the scheduler knows the holder is gone, a submit naming the ref is 410.
            assert h.delete(f"/v1/tensors/{ux}").status_code in (200, 204)
            deadline = time.monotonic() + 20
            while True:
                r = h.post("/v1/jobs", json={"graph": {"version": 1, "nodes": double(f"{j1}:y", [n, n]),
                                                       "outputs": ["z"]}, "fetch": ["z"]})
                if r.status_code != 201 or time.monotonic() > deadline:
                    break
                body = wait_done(h, r.json()["id"], "failed")  # a job started meanwhile: lost too
                assert body["error"]["kind"] == "lost", body
                time.sleep(0.5)
            assert r.status_code == 410, r.text
            assert r.json()["error"] == {**r.json()["error"], "kind": "lost", "ref": f"{j1}:y"}
            # the status read back from the metadb says the same
            assert h.get(f"/v1/jobs/{j2}").json()["error"]["kind"] == "lost"
    finally:
        c.stop(grace_s=3.0)
        c.run.clear_cluster()


def upload_files(c: LocalCluster) -> set[str]:
    return {p.name for p in (c.run.path / "tensors").glob("u-*.npy")}


def test_a_tiled_output_as_a_ref_is_read_tile_by_tile(cluster: LocalCluster) -> None:
    n = 1536  # a matmul of 9 MiB operands: cut into tiles
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = (rng.standard_normal((n, n), dtype=np.float32) * 0.03).astype(np.float32)
    xw = x.astype(np.float64) @ w.astype(np.float64)
    with api(cluster) as h:
        ux, uw = upload(h, x), upload(h, w)
        mm = {"x": inp(ux, [n, n]), "w": inp(uw, [n, n]), "m": op("matmul", ["x", "w"], [n, n])}
        j1 = submit(h, mm, ["m"])["id"]
        wait_done(h, j1)
        before = upload_files(cluster)
        # a step: z = x @ w + p, its output cut as p was -- each of p's tiles read where it is
        first = submit(h, {**mm, "p": inp(f"{j1}:m", [n, n]), "z": op("add", ["m", "p"], [n, n])}, ["z"])
        prev = first["id"]
        wait_done(h, prev)
        for _ in range(2):
            args = [f"{prev}:z" if a.startswith("j") else a for a in first["args"]]
            r = h.post("/v1/jobs", json={"plan": first["plan"], "args": args, "fetch": ["z"]})
            assert r.status_code == 201, r.text
            prev = r.json()["id"]
            wait_done(h, prev)
        tasks = h.get(f"/v1/jobs/{prev}/plan").json()["tasks"]
        assert len([t for t in tasks if t["op"] == "add"]) > 1  # it was cut into tiles
        assert upload_files(cluster) == before  # no copy was made
        np.testing.assert_allclose(fetch(h, prev, "z"), xw * 4, rtol=1e-3, atol=1e-3)
        # a whole read of a tiled value (the tiles of another job's cut): read from its
        # tiles too (slices and concats of them), no copy
        j = submit(h, double(f"{prev}:z", [n, n]), ["z"])["id"]
        assert upload_files(cluster) == before
        wait_done(h, j)
        np.testing.assert_allclose(fetch(h, j, "z"), xw * 8, rtol=1e-3, atol=1e-3)
        assert h.delete(f"/v1/jobs/{j}").status_code == 200


def test_a_job_reading_a_ref_resumes_after_a_scheduler_restart(start_cluster: Any) -> None:
    n = 512
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = (rng.standard_normal((n, n), dtype=np.float32) * 0.05).astype(np.float32)
    with start_cluster(bound_s=120, executors=2) as c, api(c) as h:
        ux, uw = upload(h, x), upload(h, w)
        j1 = submit(h, {"x": inp(ux, [n, n]), "y": op("exp", ["x"], [n, n])}, ["y"])["id"]
        wait_done(h, j1)
        time.sleep(0.6)  # the journal writes j1's task rows (where its tile is)
        j2 = submit(h, long_chain(f"{j1}:y", uw, n, 120), ["out"])["id"]
        time.sleep(0.5)
        c.restart_scheduler(kill=True)
        with api(c) as h2:
            wait_done(h2, j2)
            # j2 may have ended before the kill, its rows naming no holder of "out": its fetch
            # recomputes it (scheduler/lineage.py), which needs the executors holding its
            # inputs registered again (within a lease of the restart)
            deadline = time.monotonic() + 30
            while len(h2.get("/v1/nodes").json()["items"]) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            want = p = np.exp(x)
            for _ in range(120):
                want = np.tanh(want @ w)
            np.testing.assert_allclose(fetch(h2, j2, "out"), want + p, rtol=1e-3, atol=1e-4)


def value(v: dict[str, Any]) -> np.ndarray:
    assert v["dtype"] == "float32"
    return np.frombuffer(base64.b64decode(v["data"]), np.float32).reshape(v["shape"])


def test_one_request_per_step_wait_and_inline_values(cluster: LocalCluster) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with api(cluster) as h:
        u = upload(h, x)
        big = upload(h, np.ones((128, 256), np.float32))  # 128 KiB: over the inline limit
        nodes = {"x": inp(u, [3, 4]), "y": op("exp", ["x"], [3, 4]), "b": inp(big, [128, 256]),
                 "c": op("add", ["b", "b"], [128, 256])}
        t0 = time.monotonic()
        first = submit(h, nodes, ["y", "c"], wait_s=30, inline=["y", "c"])
        assert time.monotonic() - t0 < 30
        assert first["state"] == "done" and first["job"] == first["id"] and first["error"] is None
        assert set(first["values"]) == {"y"}  # c is too large: fetched as usual
        np.testing.assert_allclose(value(first["values"]["y"]), np.exp(x), rtol=1e-6)
        assert fetch(h, first["id"], "c").shape == (128, 256)
        # compiled steps, each one request: bind the previous step's output by ref, read it inline
        r = submit(h, double(f"{first['id']}:y", [3, 4]), ["z"], wait_s=30, inline=["z"])
        plan, prev, want = r["plan"], r["id"], np.exp(x) * 2
        np.testing.assert_allclose(value(r["values"]["z"]), want, rtol=1e-6)
        for _ in range(3):
            r = h.post("/v1/jobs", json={"plan": plan, "args": [f"{prev}:z"], "fetch": ["z"],
                                         "wait_s": 30, "inline": ["z"]})
            assert r.status_code == 201, r.text
            body = r.json()
            prev, want = body["id"], want * 2
            assert body["state"] == "done" and body["job"] == prev
            np.testing.assert_allclose(value(body["values"]["z"]), want, rtol=1e-6)
        # a job that fails answers its error
        n = 512
        uw = upload(h, np.eye(n, dtype=np.float32))
        chain: dict[str, Any] = {"w": inp(uw, [n, n])}
        last = "w"
        for i in range(200):
            chain[f"m{i}"] = op("matmul", [last, "w"], [n, n])
            last = f"m{i}"
        body = submit(h, chain, [last], wait_s=30, deadline_s=0.2, inline=[last])
        assert body["state"] == "failed" and body["error"]["kind"] == "deadline" and body["values"] == {}


def test_checkpoint_copies_of_refs_are_uploads_of_the_session(cluster: LocalCluster) -> None:
    n = 1536  # a tiled output (several tiles) beside a small one
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = (rng.standard_normal((n, n), dtype=np.float32) * 0.03).astype(np.float32)
    with api(cluster) as h:
        ux, uw = upload(h, x), upload(h, w)
        nodes = {"x": inp(ux, [n, n]), "w": inp(uw, [n, n]), "m": op("matmul", ["x", "w"], [n, n]),
                 "s": op("exp", ["m"], [n, n])}
        small = {"x": inp(upload(h, x[:3, :4].copy()), [3, 4]), "y": op("exp", ["x"], [3, 4])}
        j1 = submit(h, nodes, ["m"])["id"]
        j2 = submit(h, small, ["y"])["id"]
        wait_done(h, j1)
        wait_done(h, j2)
        sid = h.post("/v1/sessions").json()["id"]
        r = h.post("/v1/tensors/copy", json={"from": [f"{j1}:m", f"{j2}:y"]},
                   headers={"X-Triplane-Session": sid})
        assert r.status_code == 201, r.text
        big_id, small_id = r.json()["ids"]
        assert all(u.startswith("u-") for u in (big_id, small_id))
        # released jobs: the copies stay (they are uploads) and bind as inputs like any
        for j in (j1, j2):
            assert h.delete(f"/v1/jobs/{j}").status_code == 200
        j = submit(h, {"p": inp(big_id, [n, n]), "z": op("add", ["p", "p"], [n, n]),
                       "q": inp(small_id, [3, 4]), "r": op("add", ["q", "q"], [3, 4])}, ["z", "r"])["id"]
        wait_done(h, j)
        np.testing.assert_allclose(fetch(h, j, "z"), (x.astype(np.float64) @ w) * 2, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(fetch(h, j, "r"), np.exp(x[:3, :4]) * 2, rtol=1e-6)
        r = h.post("/v1/tensors/copy", json={"from": [f"{j1}:m"]})
        assert r.status_code == 404 and r.json()["error"]["ref"] == f"{j1}:m", r.text
        # ending the session frees its copies
        assert h.delete(f"/v1/sessions/{sid}").json()["uploads"] == 2
        assert not {big_id + ".npy", small_id + ".npy"} & upload_files(cluster)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_chain_of_200_steps_by_ref_releasing_each_leaves_memory_flat(cluster: LocalCluster) -> None:
    n, steps = 512, 200  # 1 MiB a value: 200 MiB if released values leaked
    x = np.ones((n, n), np.float32)
    c = np.full((n, n), 0.5, np.float32)
    with api(cluster) as h:
        ux, uc = upload(h, x), upload(h, c)
        base = settled_free(cluster)
        prev = submit(h, {"x": inp(ux, [n, n]), "y": op("exp", ["x"], [n, n])}, ["y"])["id"]
        wait_done(h, prev)
        first = submit(h, {"p": inp(f"{prev}:y", [n, n]), "c": inp(uc, [n, n]),
                           "z": op("add", ["p", "c"], [n, n])}, ["z"])
        assert h.delete(f"/v1/jobs/{prev}").status_code == 200
        prev = first["id"]
        rss = []
        done = 1
        args = ["{prev}:z" if a.startswith("j") else a for a in first["args"]]
        while done < steps:
            r = h.post("/v1/jobs", json={"plan": first["plan"], "fetch": ["z"],
                                         "args": [a.format(prev=prev) for a in args]})
            if r.status_code == 409 and r.json()["error"]["kind"] == "not_ready":
                wait_done(h, prev)  # the previous step still runs
                continue
            assert r.status_code == 201, r.text
            assert h.delete(f"/v1/jobs/{prev}").status_code == 200  # released while its reader may run
            prev, done = r.json()["id"], done + 1
            if done in (50, steps):
                rss.append(rss_bytes(cluster.scheduler.pid))
        wait_done(h, prev)
        np.testing.assert_allclose(fetch(h, prev, "z")[0, :3], np.e + 0.5 * steps, rtol=1e-5)
        assert h.delete(f"/v1/jobs/{prev}").status_code == 200
        after = settled_free(cluster, base)
        assert after >= base - (1 << 20), (base, after)  # every value released
        assert rss[1] - rss[0] < 32 << 20, rss


def test_a_chain_of_tiled_steps_read_whole_by_the_next_makes_no_copy_and_leaves_memory_flat(
        cluster: LocalCluster) -> None:
    # z = c @ p: cut by rows of c, each task reads p whole -- the next step reads the
    # previous z whole, though it is held in row tiles (issue 12: it was copied through
    # the scheduler's disk every step). Now the step reads those tiles where they are.
    n, steps = 1024, 30
    rng = np.random.default_rng(3)
    p0 = rng.standard_normal((n, n), dtype=np.float32)
    c = np.eye(n, dtype=np.float32) * np.float32(0.9)
    with api(cluster) as h:
        up, uc = upload(h, p0), upload(h, c)
        base = settled_free(cluster)
        before = upload_files(cluster)
        step = {"c": inp(uc, [n, n]), "z": op("matmul", ["c", "p"], [n, n])}
        prev = submit(h, {**step, "p": inp(up, [n, n])}, ["z"])["id"]
        wait_done(h, prev)
        first = submit(h, {**step, "p": inp(f"{prev}:z", [n, n])}, ["z"])
        wait_done(h, first["id"])
        assert h.delete(f"/v1/jobs/{prev}").status_code == 200
        prev = first["id"]
        grid = h.get(f"/v1/jobs/{prev}/plan").json()["tasks"]
        assert len([t for t in grid if t["op"] == "matmul"]) > 1  # it was cut into tiles
        args = ["{prev}:z" if a.startswith("j") else a for a in first["args"]]
        for _ in range(steps - 2):
            r = h.post("/v1/jobs", json={"plan": first["plan"], "fetch": ["z"],
                                         "args": [a.format(prev=prev) for a in args]})
            assert r.status_code == 201, r.text
            assert upload_files(cluster) == before  # no copy of the ref was made
            wait_done(h, r.json()["id"])
            assert h.delete(f"/v1/jobs/{prev}").status_code == 200
            prev = r.json()["id"]
        np.testing.assert_allclose(fetch(h, prev, "z"), p0 * np.float32(0.9) ** steps, rtol=1e-4, atol=1e-6)
        assert h.delete(f"/v1/jobs/{prev}").status_code == 200
        after = settled_free(cluster, base)
        assert after >= base - (1 << 20), (base, after)  # every step's tiles released
