"""Engines as plugins on a real cluster: the example vendor package (a C library found
only through entry points) on one executor of two, user ops of its C library and of a
Python package run on the cluster, placement sending the vendor executor only the ops
it declares, a job whose op no executor runs refused at submit naming the op, and bad
plugins isolated on a serving executor (its log, its registry record, ``triplane status``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cluster_rows import task_rows
from cluster_run import running_cluster
from plugin_sites import ROOT, install_vendor, write_bad_plugins, write_python_ops

from triplane.launcher import LocalCluster
from triplane.registry import connect_registry

DECLARED = {"add", "mul", "relu", "matmul", "vendor_softplus"}


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return [install_vendor(tmp_path_factory.mktemp("vendor")),
            write_bad_plugins(tmp_path_factory.mktemp("bad")),
            write_python_ops(tmp_path_factory.mktemp("py"))]


@pytest.fixture(scope="module")
def installed(sites: list[Path]) -> Iterator[None]:
    """The packages on every cluster process's path (as if pip-installed on the machine)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join([*map(str, sites), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    yield
    mp.undo()


def api(c: LocalCluster) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.token}"}, timeout=30.0)


def upload(h: httpx.Client, arr: np.ndarray) -> str:
    r = h.post("/v1/tensors", content=arr.tobytes(), headers={
        "X-Triplane-Shape": ",".join(map(str, arr.shape)), "X-Triplane-Dtype": str(arr.dtype)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def inp(tensor: str, shape: list[int]) -> dict[str, Any]:
    return {"op": "input", "shape": shape, "dtype": "float32",
            "attrs": {"tensor": tensor, "shape": shape, "dtype": "float32"}}


def op(name: str, inputs: list[str], shape: list[int]) -> dict[str, Any]:
    return {"op": name, "inputs": inputs, "shape": shape, "dtype": "float32", "attrs": {}}


def submit(h: httpx.Client, nodes: dict[str, Any], fetch: list[str]) -> httpx.Response:
    graph = {"version": 1, "nodes": nodes, "outputs": fetch}
    return h.post("/v1/jobs", json={"graph": graph, "fetch": fetch})


def fetch(h: httpx.Client, job: str, name: str) -> np.ndarray:
    r = h.get(f"/v1/jobs/{job}/tensors/{name}")
    assert r.status_code == 200, r.text
    shape = tuple(int(d) for d in r.headers["x-triplane-shape"].split(",") if d)
    return np.frombuffer(r.content, np.float32).reshape(shape)


def run_job(h: httpx.Client, nodes: dict[str, Any], names: list[str]) -> tuple[str, dict[str, np.ndarray]]:
    r = submit(h, nodes, names)
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    body = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 60}).json()
    assert body["state"] == "done", body
    return job, {n: fetch(h, job, n) for n in names}


@pytest.fixture
def sdk_ops(sites: list[Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The installed packages on this process's path too (the SDK records their ops); the
    op table and discovery state as they were afterwards."""
    from triplane.engines import registry
    from triplane.proto import optable

    before = set(optable.names())
    for site in sites:
        monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_op_plugins", None)
    monkeypatch.setattr(registry, "_op_cache", {})
    yield
    for name in set(optable.names()) - before:
        optable.unregister(name)


def test_a_c_user_op_runs_on_the_vendor_executor_and_placement_keeps_to_its_ops(
        installed: None, sdk_ops: None, tmp_path: Path) -> None:
    # executor-0: numpy and the Python user op's engine; executor-1: the vendor's C engine only
    with running_cluster(tmp_path / "home", bound_s=240.0, executors=1, engines="numpy,pyops") as c:
        c.add_executor(extra_args=["--engines", "vendor_c"])
        h = api(c)
        records = {(e["node"], e["engine"]): e for e in _engines(h)}
        vendor = records["executor-1", "vendor_c"]
        assert set(vendor["ops"]) == DECLARED and vendor["dtypes"] == ["float32"]
        assert set(records) == {("executor-0", "numpy"), ("executor-0", "pyops"), ("executor-1", "vendor_c")}

        rng = np.random.default_rng(1)
        x = rng.uniform(-4, 4, (64, 64)).astype(np.float32)
        w = rng.uniform(-1, 1, (64, 64)).astype(np.float32)
        nodes = {"x": inp(upload(h, x), [64, 64]), "w": inp(upload(h, w), [64, 64]),
                 "s": op("vendor_softplus", ["x"], [64, 64]), "m": op("matmul", ["x", "w"], [64, 64]),
                 "r": op("relu", ["m"], [64, 64]), "e": op("exp", ["s"], [64, 64]),
                 "c": op("py_cube", ["x"], [64, 64])}
        job, got = run_job(h, nodes, ["s", "r", "e", "c"])
        np.testing.assert_allclose(got["s"], np.logaddexp(0, x.astype(np.float64)), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["r"], np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["e"], np.exp(np.logaddexp(0, x)), rtol=1e-5)
        np.testing.assert_allclose(got["c"], x**3, rtol=1e-6)
        rows = task_rows(c.db, job)
        assert rows and all(r.state == "done" for r in rows)
        on = {r.op: {x.node for x in rows if x.op == r.op} for r in rows}
        assert on["vendor_softplus"] == {"executor-1"}  # only the vendor engine has its kernel
        assert on["exp"] == on["py_cube"] == {"executor-0"}
        assert {r.op for r in rows if r.node == "executor-1"} <= DECLARED, [(r.op, r.node) for r in rows]

        # The SDK records the installed op like a built-in and the cluster runs it.
        import triplane as tp
        from triplane.sdk.custom import installed_op

        softplus = installed_op("vendor_softplus")
        session = tp.connect(c.url, c.token, poll_s=1.0)
        try:
            y = softplus(tp.Tensor.from_array(x) * 2.0).numpy()
        finally:
            tp.disconnect()
            session.close()
        np.testing.assert_allclose(y, np.logaddexp(0, 2.0 * x.astype(np.float64)), rtol=1e-6, atol=1e-6)

        # Without the vendor executor no node runs vendor_softplus: refused at submit, naming it.
        c.kill_executor(1, sig=signal.SIGTERM)
        deadline = time.monotonic() + 20
        while any(e["engine"] == "vendor_c" for e in _engines(h)):
            assert time.monotonic() < deadline, "the stopped executor stayed in the registry"
            time.sleep(0.2)
        time.sleep(1.5)  # the scheduler's figures are read from the registry at most once a second
        r = submit(h, {"x": nodes["x"], "s": nodes["s"]}, ["s"])
        assert r.status_code == 400, r.text
        assert "vendor_softplus" in r.json()["error"]["message"], r.text
        r = submit(h, {"x": nodes["x"], "s": op("vendor_gelu", ["x"], [64, 64])}, ["s"])
        assert r.status_code == 400 and "vendor_gelu" in r.text, r.text


def _stats(c: LocalCluster, node: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        reg = connect_registry(c.executor_registry, secret=c.run.secret_file.read_text().strip())
        try:
            entry = await reg.get(f"stats/{node}")
            return json.loads(entry.value) if entry is not None else {}
        finally:
            await reg.close()

    deadline = time.monotonic() + 15
    while True:
        stats = asyncio.run(read())
        if stats or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


def test_bad_plugins_leave_the_executor_serving_with_the_message_in_log_registry_and_status(
        installed: None, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_cluster(home, bound_s=240.0, executors=1, engines="numpy") as c:
        # Started after `up` wrote cluster.json: status finds it through the registry.
        c.add_executor(extra_args=["--engines", "auto", "--memory-engine", "liar"])
        assert "executor-1" not in json.dumps(c.run.read_cluster())
        h = api(c)
        engines = sorted(e["engine"] for e in _engines(h) if e["node"] == "executor-1")
        assert engines == ["numpy", "pyops", "vendor_c"]  # 'explodes' and 'broken' left out
        x = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
        _, got = run_job(h, {"x": inp(upload(h, x), [3, 4]), "y": op("mul", ["x", "x"], [3, 4]),
                             "z": op("exp", ["y"], [3, 4])}, ["z"])
        np.testing.assert_allclose(got["z"], np.exp(x * x), rtol=1e-6)

        log = c.run.log("executor-1").read_text()
        for name in ("op plugin 'explodes': cannot be made: RuntimeError: vendor driver libfoo.so.3 "
                     "not found",
                     "op plugin 'broken': fails the conformance kit on 2 case(s): add (float32)",
                     "memory plugin 'liar': claims a capacity of"):
            assert f"plugin isolated: {name}" in log, log
        problems = {p["name"]: p for p in _stats(c, "executor-1")["plugins"]}
        assert set(problems) == {"explodes", "broken", "liar"}
        assert problems["liar"]["kind"] == "memory"

        env = {**os.environ, "TRIPLANE_HOME": str(home)}
        listed: list[dict[str, str]] = []
        deadline = time.monotonic() + 20
        while len(listed) < 3:  # the scheduler reads the stats record the executor publishes each second
            assert time.monotonic() < deadline, listed
            done = subprocess.run([sys.executable, "-m", "triplane", "status", "--json"], capture_output=True,
                                  text=True, env=env, timeout=60)
            assert done.returncode == 0, done.stderr
            listed = json.loads(done.stdout)["plugins"]
        assert {p["process"] for p in listed} == {"executor-1"} and len(listed) == 3, listed
        assert {p["name"]: p["kind"] for p in listed} == {"explodes": "op", "broken": "op", "liar": "memory"}
        nodes = {n["node"]: n for n in h.get("/v1/nodes").json()["items"]}
        assert nodes["executor-0"]["plugins"] == [] and len(nodes["executor-1"]["plugins"]) == 3
        shown = subprocess.run([sys.executable, "-m", "triplane", "status"], capture_output=True, text=True,
                               env={**env, "COLUMNS": "200"}, timeout=60).stdout
        assert "executor-1: plugin isolated: op plugin 'explodes'" in shown, shown


def _engines(h: httpx.Client) -> list[dict[str, Any]]:
    """Every registered op engine (``GET /v1/engines``, one page of up to 1000)."""
    return list(h.get("/v1/engines", params={"limit": 1000}).json()["items"])
