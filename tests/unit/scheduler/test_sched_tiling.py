"""Tiling and placement at submit, without sockets: the layout of a job, the dispatcher
following placement, upload regions, and the refusals at submit (docs/runtime.md).

The API tests run a Scheduler that is not started (FastAPI's TestClient in memory); its
"executors" are registry records only, so jobs are laid out and queued, never run
(tests/integration/tiling runs them)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from triplane import metadb as mdb
from triplane.proto.builder import Builder
from triplane.proto.errors import LimitError
from triplane.proto.validate import validate
from triplane.registry import MemoryBackend, MemoryEngineInfo, NodeInfo, OpEngineInfo
from triplane.registry.records import encode
from triplane.scheduler.api.app import create_app
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.jobplan import plan_job
from triplane.scheduler.compiler.layout import figures_from_json, figures_to_json, lay_out
from triplane.scheduler.compiler.pipeline import PlanCache
from triplane.scheduler.compiler.placement import PlacementError
from triplane.scheduler.dispatch.state import (
    DispatchState,
    NodeDown,
    NodeUp,
    Send,
    SubmitJob,
    TaskSpec,
    TaskSucceeded,
)
from triplane.scheduler.service import Scheduler
from triplane.scheduler.store import TensorStore

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MiB = 1 << 20


def _figs(n: int = 3, memory: int = 64 * MiB, dtypes: frozenset[str] | None = None) -> list[NodeFigures]:
    return [NodeFigures(f"e{i}", 50.0, 10.0, memory, dtypes=dtypes) for i in range(n)]


def _matmul(m: int, k: int, n: int) -> tuple:
    b = Builder()
    a = b.add_node("normal", [], {"shape": (m, k), "seed": 1, "dtype": "float32"}, node_id="a")
    w = b.add_node("normal", [], {"shape": (k, n), "seed": 2, "dtype": "float32"}, node_id="w")
    y = b.add_node("matmul", [a, w], {}, node_id="y")
    return validate(b.graph([y])), "y"


# --- layout ---------------------------------------------------------------------------


def test_a_tiny_graph_is_neither_tiled_nor_placed_at_submit() -> None:
    g, _ = _matmul(8, 8, 8)
    lay = lay_out(g, _figs())
    assert not lay.tiled and lay.placement is None and lay.graph is g
    placed = lay.placed()  # on demand (GET /plan)
    assert placed.placement is not None and set(placed.placement.tasks) == {"a", "w", "y"}


def test_a_large_graph_is_tiled_with_wire_safe_task_ids_and_placed_on_every_node() -> None:
    g, y = _matmul(2001, 3000, 2003)  # 64 MB of inputs and output: more than one task may take
    lay = lay_out(g, _figs())
    assert lay.tiled and lay.placement is not None
    assert all(t.startswith("t") and t[1:].isdigit() for t in lay.graph.nodes)
    grid = lay.grids[y]
    assert len(grid) > 1 and all(t in lay.graph.nodes for t in grid.tiles.values())
    assert {lay.origin[t] for t in grid.tiles.values()} == {y}
    assert len({tp.node for tp in lay.placement.tasks.values()}) == 3
    assert lay.preferred(grid.tiles[(0, 0)]) in {"e0", "e1", "e2"}


def test_a_graph_over_the_cluster_memory_is_refused_naming_the_tensor_and_limit() -> None:
    g, _ = _matmul(16384, 16384, 8)  # a: 1 GiB; 3 x 64 MiB
    with pytest.raises(LimitError) as e:
        lay_out(g, _figs())
    assert e.value.node == "a" and "1 GiB" in str(e.value) and "192 MiB" in str(e.value)


def test_an_unsupported_dtype_is_refused_even_for_a_tiny_graph() -> None:
    b = Builder()
    x = b.add_node("input", [], {"tensor": "x", "shape": (1, 3, 8, 8), "dtype": "float64"}, node_id="x")
    w = b.add_node("input", [], {"tensor": "w", "shape": (4, 3, 3, 3), "dtype": "float64"}, node_id="w")
    b.add_node("conv2d", [x, w], {}, node_id="y")
    g = validate(b.graph(["y"]))
    with pytest.raises(PlacementError) as e:
        lay_out(g, _figs(dtypes=frozenset({"float32"})))
    assert e.value.node == "y" and e.value.status.code.value == "UnschedulableAndUnresolvable"
    assert "no engine supports conv2d on float64" in str(e.value)


def test_figures_round_trip_so_a_resumed_job_is_laid_out_identically() -> None:
    g, y = _matmul(1001, 1500, 1003)
    figs = _figs()
    again = figures_from_json(figures_to_json(figs))
    a, b = lay_out(g, figs, whole_s=0), lay_out(g, again, whole_s=0)  # cut: 16 MB, 3 GFLOP
    assert a.tiled and a.graph == b.graph and a.grids[y] == b.grids[y]
    assert lay_out(g, figs).tiled is lay_out(g, again).tiled  # and kept whole alike


def test_job_tasks_follow_the_placement_and_input_slices_read_upload_regions() -> None:
    b = Builder()
    x = b.add_node("input", [], {"tensor": "arg0", "shape": (1200, 1100), "dtype": "float32"}, node_id="n0")
    b.add_node("exp", [x], {}, node_id="n1")
    g = validate(b.graph(["n1"]))
    u = "u-" + "ab" * 16
    plan = plan_job("j" + "0" * 16, g, [u], {"y": "n1"}, {"n1": "y", "n0": "x"}, PlanCache(), figures=_figs(),
                    explicit={"n1": {"d0": 500, "d1": 600}})  # uneven: 500, 500, 200 x 600, 500
    lay = plan.layout
    assert lay is not None and lay.tiled and lay.placement is not None
    assert plan.uploads == {"n0": u}  # the plan graph's view, for submit checks and fetch
    for spec in plan.specs:
        assert spec.node == lay.placement.tasks[spec.id].node
    regions = [t for tpl in plan.templates.values() for t in tpl.uploads]
    assert regions and all(r.startswith(u + "@") for r in regions)
    rows, cols = ((0, 500), (500, 1000), (1000, 1200)), ((0, 600), (600, 1100))
    assert sorted(regions) == sorted(f"{u}@{r0}:{r1},{c0}:{c1}" for r0, r1 in rows for c0, c1 in cols)
    grid = plan.fetch_grid("y")
    assert grid is not None and len(grid) > 1
    with pytest.raises(ValueError):
        plan.fetch_tile("y")


# --- the store serves regions of uploads ---------------------------------------------------


def test_the_store_serves_a_region_of_an_upload_and_refuses_bad_ones(tmp_path: Path) -> None:
    store = TensorStore(tmp_path)
    arr = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    t = store.put(arr.tobytes(), (7, 5), "float32")
    found = store.region(f"{t.id}@2:6,1:4")
    assert found is not None
    meta, data = found
    assert meta.shape == (4, 3) and meta.nbytes == 48
    np.testing.assert_array_equal(np.frombuffer(data, np.float32).reshape(4, 3), arr[2:6, 1:4])
    whole = store.region(t.id)
    assert whole is not None and whole[0].shape == (7, 5)
    for bad in (f"{t.id}@2:6", f"{t.id}@2:8,0:5", f"{t.id}@3:2,0:5", f"{t.id}@a:b,0:5", f"{t.id}@-1:2,0:5",
                "u-" + "0" * 32 + "@0:1,0:1", f"{t.id}@0:1,0:1,0:1"):
        assert store.region(bad) is None, bad


# --- the dispatcher follows placement ------------------------------------------------------


def _sends(out: list) -> dict[str, str]:
    return {i.task: i.node for i in out if isinstance(i, Send)}


def test_the_dispatcher_sends_each_task_to_its_placed_node_and_waits_for_its_slot() -> None:
    s = DispatchState()
    for n in ("a", "b"):
        s.handle(NodeUp(f"up:{n}", n, 1, 0.0))
    specs = tuple(TaskSpec(t, "full", node=n) for t, n in (("t0", "b"), ("t1", "b"), ("t2", "a")))
    out = s.handle(SubmitJob("s", "j", specs, 0.0))
    assert _sends(out) == {"t0": "b", "t2": "a"}  # t1 waits for b's slot, not for a
    s.validate_state()
    out = s.handle(TaskSucceeded("r", "j", "t2", 0, "a", 0.1))
    assert _sends(out) == {}  # a is free, but t1 is b's
    out = s.handle(TaskSucceeded("r", "j", "t0", 0, "b", 0.2))
    assert _sends(out) == {"t1": "b"}
    s.validate_state()


def test_a_task_whose_placed_node_died_drifts_to_another() -> None:
    s = DispatchState()
    for n in ("a", "b"):
        s.handle(NodeUp(f"up:{n}", n, 2, 0.0))
    out = s.handle(SubmitJob("s", "j", (TaskSpec("t0", "full", node="b"),), 0.0))
    assert _sends(out) == {"t0": "b"}
    s.handle(NodeDown("down:b", "b", 0.1))
    out = s.handle(NodeUp("up:a", "a", 2, 1.0))  # a tick later (after the backoff)
    assert _sends(out) == {"t0": "a"}
    assert s.jobs["j"].tasks["t0"].attempt == 1
    s.validate_state()


# --- refusals at submit through the API ------------------------------------------------------


def _client(tmp_path: Path, *, memory: int, dtypes: tuple[str, ...]) -> TestClient:
    reg = MemoryBackend()

    async def register() -> None:
        for i in range(3):
            node = f"e{i}"
            for rec in (
                NodeInfo(node, "127.0.0.1", 1, 1, 1, "0", 0.0, 1),
                OpEngineInfo(node, "numpy", "numpy", "cpu", ("normal", "matmul", "full", "conv2d", "exp"),
                             dtypes, 50.0, 10.0),
                MemoryEngineInfo(node, "host", "host", memory, memory),
            ):
                await reg.put(rec.key(), encode(rec))

    asyncio.run(register())
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=reg, db=db, run_dir=tmp_path, secret=b"s" * 32)
    return TestClient(create_app(s, TOKEN))


def _upload(c: TestClient, arr: np.ndarray) -> str:
    r = c.post("/v1/tensors", content=arr.tobytes(), headers={
        **AUTH, "X-Triplane-Shape": ",".join(map(str, arr.shape)), "X-Triplane-Dtype": str(arr.dtype)})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_submit_refuses_a_tensor_larger_than_the_cluster_with_400_naming_it(tmp_path: Path) -> None:
    c = _client(tmp_path, memory=64 * MiB, dtypes=("float32",))
    doc = {"version": 1, "outputs": ["big"], "nodes": {
        "big": {"op": "normal", "shape": [16384, 16384], "dtype": "float32",
                "attrs": {"seed": 1, "mean": 0, "std": 1, "offset": 0, "dtype": "float32",
                          "shape": [16384, 16384], "full_shape": None, "start": None}}}}
    r = c.post("/v1/jobs", json={"graph": doc, "fetch": ["big"]}, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["kind"] == "limit" and err["node"] == "big" and err["op"] == "normal"
    assert "1 GiB" in err["message"] and "192 MiB" in err["message"]
    assert c.get("/v1/jobs", headers=AUTH).json()["items"] == []  # nothing stored: never half-run


def test_submit_refuses_an_op_on_a_dtype_no_engine_takes_with_400(tmp_path: Path) -> None:
    c = _client(tmp_path, memory=1 << 30, dtypes=("float32",))
    ux, uw = (_upload(c, np.ones(shape)) for shape in ((1, 3, 8, 8), (4, 3, 3, 3)))
    doc = {"version": 1, "outputs": ["y"], "nodes": {
        "x": {"op": "input", "shape": [1, 3, 8, 8], "dtype": "float64",
              "attrs": {"tensor": ux, "shape": [1, 3, 8, 8], "dtype": "float64"}},
        "w": {"op": "input", "shape": [4, 3, 3, 3], "dtype": "float64",
              "attrs": {"tensor": uw, "shape": [4, 3, 3, 3], "dtype": "float64"}},
        "y": {"op": "conv2d", "inputs": ["x", "w"], "shape": [1, 4, 6, 6], "dtype": "float64",
              "attrs": {"dilation": [1, 1], "groups": 1, "padding": [0, 0], "stride": [1, 1]}}}}
    r = c.post("/v1/jobs", json={"graph": doc, "fetch": ["y"]}, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["kind"] == "placement" and err["node"] == "y" and err["op"] == "conv2d"
    assert "no engine supports conv2d on float64" in err["message"]
    assert c.get("/v1/jobs", headers=AUTH).json()["items"] == []


def test_executors_of_one_host_share_its_best_measured_figures() -> None:
    from triplane.scheduler.compiler.layout import same_host_figures

    figs = [NodeFigures("e0", 1.8, 13.0, MiB, bandwidth_gbps=0.75, latency_us=178.0),
            NodeFigures("e1", 125.0, 4.9, MiB, bandwidth_gbps=0.12, latency_us=190.0),
            NodeFigures("e2", 5.5, 6.7, MiB, bandwidth_gbps=0.5, latency_us=150.0),
            NodeFigures("far", 20.0, 2.0, MiB, bandwidth_gbps=0.1, latency_us=900.0)]
    out = same_host_figures(figs, {"e0": "10.0.0.1", "e1": "10.0.0.1", "e2": "10.0.0.1", "far": "10.0.0.2"})
    assert [(n.gflops, n.gbps) for n in out] == [(125.0, 13.0)] * 3 + [(20.0, 2.0)]
    # the loopback too (pulls to a node that measured it badly would look 6x slower)
    assert [(n.bandwidth_gbps, n.latency_us) for n in out] == [(0.75, 150.0)] * 3 + [(0.1, 900.0)]


def test_executors_beyond_a_hosts_cores_share_its_compute() -> None:
    from triplane.scheduler.compiler.layout import same_host_figures

    figs = [NodeFigures(f"e{i}", 120.0, 12.0, MiB) for i in range(3)] + [NodeFigures("far", 90.0, 9.0, MiB)]
    hosts = {"e0": "10.0.0.1", "e1": "10.0.0.1", "e2": "10.0.0.1", "far": "10.0.0.2"}
    # three executors on two cores: two thirds of a core's figures each; one on 8 cores: all
    out = same_host_figures(figs, hosts, {"e0": 2, "e1": 2, "e2": 2, "far": 8})
    assert [(n.gflops, n.gbps) for n in out] == [(80.0, 8.0)] * 3 + [(90.0, 9.0)]
    # as many cores as executors, or cores not reported (0): unchanged
    for cpus in ({"e0": 3, "e1": 3, "e2": 3}, {}):
        assert [n.gflops for n in same_host_figures(figs, hosts, cpus)] == [120.0] * 3 + [90.0]


def test_task_names_do_not_depend_on_how_the_graph_was_stored() -> None:
    # A restarted scheduler lays a job out again from the stored graph, whose nodes may come
    # back in another order: task tN must still name the same tile, or recorded tiles would
    # be reused for the wrong tasks.
    from triplane.proto.ir import Graph

    b = Builder()
    outs = []
    for i in range(2):  # two independent branches: their relative order is storage's choice
        x = b.add_node("normal", [], {"shape": (2048, 1024), "seed": i, "dtype": "float32"}, node_id=f"x{i}")
        outs.append(b.add_node("exp", [x], {}, node_id=f"y{i}"))
    g = validate(b.graph(outs))
    again = Graph(dict(reversed(list(g.nodes.items()))), g.outputs)
    assert list(again.nodes) != list(g.nodes)
    a, b = lay_out(g, _figs()), lay_out(again, _figs())
    assert a.tiled and len(a.graph) >= 4
    assert {k: n for k, n in a.graph.nodes.items()} == {k: n for k, n in b.graph.nodes.items()}
