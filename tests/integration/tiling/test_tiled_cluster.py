"""Split execution on a real local cluster: 3 executor processes on loopback.

Each workload is large enough for the executors' 64 MiB (a task may use half: 32 MiB) to
force tiles, so the job really runs as many tile tasks on several nodes (asserted from
``GET /v1/jobs/{id}/plan``), and its result equals the embedded session's (float32; the
tolerances are stated per test: tiling changes only summation order). Every cluster is
bounded in time and torn down on failure (tests/integration/cluster/conftest.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import triplane as tp
from triplane.embedded import EmbeddedSession
from triplane.engines.op.numpy_kernels import random as rnd
from triplane.launcher import LocalCluster
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, running_cluster: Any) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("tiled"), bound_s=300.0, executors=3, memory="64MiB") as c:
        yield c


@pytest.fixture(scope="module")
def remote(cluster: LocalCluster) -> Iterator[RemoteSession]:
    s = RemoteSession(cluster.url, cluster.token, job_timeout_s=120.0, reconnect_s=20.0, poll_s=2.0)
    yield s
    s.close()


def _api(cluster: LocalCluster) -> httpx.Client:
    return httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                        timeout=60.0)


def _run_both(remote: RemoteSession, make: Callable[[], Any]) -> tuple[np.ndarray, np.ndarray, str]:
    with use_session(EmbeddedSession()):
        want = make().numpy()
    with use_session(remote):
        got = make().numpy()
    assert remote.last_job is not None
    return got, want, remote.last_job


def _plan(cluster: LocalCluster, job: str) -> dict[str, Any]:
    with _api(cluster) as c:
        r = c.get(f"/v1/jobs/{job}/plan")
        assert r.status_code == 200, r.text
        doc = r.json()
        c.delete(f"/v1/jobs/{job}")  # release its tiles: the next test has the memory
    # Executors publish their free memory every second and the scheduler reads it at most
    # once a second: wait, so the next job is placed on every node, not only the emptiest.
    time.sleep(2.5)
    return doc


def _assert_split(doc: dict[str, Any], min_tasks: int = 4, spread: bool = True) -> None:
    """Several tiles and tasks; with ``spread``, on several nodes. (Only the matmuls assert
    the spread: for two or three cheap tasks reading the scheduler's uploads, one node can
    honestly be the predicted-fastest choice, depending on the measured figures.)"""
    assert doc["tiled"] is True and doc["followed"] is True
    assert len(doc["tasks"]) >= min_tasks, len(doc["tasks"])
    if spread:
        assert len({t["node"] for t in doc["tasks"]}) >= 2, "tasks ran on one node only"
    assert max(len(t["tiles"]) for t in doc["tensors"]) > 1


RNG = np.random.default_rng(20240611)
A = RNG.standard_normal((2001, 3000)).astype(np.float32)  # 64 MB with B and the output: M, N cut
B = RNG.standard_normal((3000, 2003)).astype(np.float32)
U = RNG.standard_normal((1, 9_000_001)).astype(np.float32)  # 72 MB with V; only K can be cut
V = RNG.standard_normal((9_000_001, 1)).astype(np.float32)
X = RNG.standard_normal((3001, 2003)).astype(np.float32)   # 24 MB in, 24 MB out: rows/cols cut
R = RNG.standard_normal((4001, 2500)).astype(np.float32)   # 40 MB


def test_matmul_with_uneven_edges_equals_embedded(cluster: LocalCluster, remote: RemoteSession) -> None:
    got, want, job = _run_both(remote, lambda: tp.tensor(A) @ tp.tensor(B))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # float32; same K order per tile
    doc = _plan(cluster, job)
    _assert_split(doc)
    out = next(t for t in doc["tensors"] if len(t["tiles"]) > 1)
    assert len({t["type"] for t in out["tiles"]}) >= 2, "2001 x 2003 cut evenly?"
    # The plan carries predictions and, the job being done, the actual times beside them.
    span = doc["makespan"]
    assert span["predicted_s"] > 0 and span["actual_s"] > 0
    assert span["ratio"] == pytest.approx(span["actual_s"] / span["predicted_s"])
    for t in doc["tasks"]:
        assert t["predicted"]["compute_s"] > 0 and t["actual"] is not None and t["ratio"] is not None
    assert sum(n["tasks"] for n in doc["nodes"]) == len(doc["tasks"])
    assert all(n["peak_memory_bytes"] > 0 for n in doc["nodes"] if n["tasks"])


def test_k_split_matmul_equals_embedded(cluster: LocalCluster, remote: RemoteSession) -> None:
    got, want, job = _run_both(remote, lambda: tp.tensor(U) @ tp.tensor(V))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-2)  # float32, 9e6 terms summed in pieces
    doc = _plan(cluster, job)
    assert doc["tiled"] is True
    partials = [t for t in doc["tasks"] if t["op"] == "matmul"]
    adds = [t for t in doc["tasks"] if t["op"] == "add"]
    assert len(partials) >= 2 and len(adds) == len(partials) - 1, "K was not split into partial sums"
    # Where the partial products run is placement's choice from the measured figures (on a
    # loaded machine one node can honestly be predicted fastest for all of them); the
    # M/N-split test above asserts the spread.


def test_elementwise_chain_equals_embedded(cluster: LocalCluster, remote: RemoteSession) -> None:
    got, want, job = _run_both(remote, lambda: tp.exp(tp.tensor(X) * 0.5 + 1.0))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    doc = _plan(cluster, job)
    # How many tiles depends on the executors' measured figures; split it must be.
    _assert_split(doc, min_tasks=2, spread=False)
    tiles = doc["tensors"][-1]["tiles"] if doc["tensors"] else []
    assert len({t["type"] for t in tiles}) >= 2 or len(tiles) > 1  # 3001 x 2003: uneven tiles


def test_reduction_equals_embedded(cluster: LocalCluster, remote: RemoteSession) -> None:
    got, want, job = _run_both(remote, lambda: tp.tensor(R).sum(axis=0))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    _assert_split(_plan(cluster, job), min_tasks=2, spread=False)


@pytest.mark.parametrize("axis", [None, 1], ids=["all", "rows"])
def test_fused_chain_reduction_equals_embedded_and_float64(cluster: LocalCluster, remote: RemoteSession,
                                                            axis: int | None) -> None:
    """exp(r * 0.5 + 0.25).sum(): one fused task per tile reduces as it goes (no tile of
    the chain's 40 MB result is ever made), partial sums combined across the nodes."""
    got, want, job = _run_both(remote, lambda: tp.exp(tp.tensor(R) * 0.5 + 0.25).sum(axis=axis))
    body = np.exp(R.astype(np.float64) * 0.5 + 0.25)
    ref, scale = body.sum(axis=axis), np.abs(body).sum(axis=axis)
    # float32 terms; each tile and slice summed pairwise, slices merged in float64, tiles
    # in float32 by the combine tree: a few float32 ulps of the sum's scale.
    assert np.all(np.abs(got - ref) <= 1e-6 * scale), np.max(np.abs(got - ref) / scale)
    assert np.all(np.abs(got - want) <= 2e-6 * scale)
    doc = _plan(cluster, job)
    assert doc["tiled"] is True and doc["followed"] is True
    fused = [t for t in doc["tasks"] if t["op"] == "fused"]
    assert len(fused) >= 2, [t["op"] for t in doc["tasks"]]  # partials (all) or row tiles
    assert not [t for t in doc["tasks"] if t["op"] in ("exp", "mul", "sum")], "not fused"
    assert all("," not in t["type"] for t in doc["tasks"] if t["op"] == "add")  # combines of results


def test_softmax_equals_embedded(cluster: LocalCluster, remote: RemoteSession) -> None:
    got, want, job = _run_both(remote, lambda: tp.nn.functional.softmax(tp.tensor(X), axis=-1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
    _assert_split(_plan(cluster, job), min_tasks=2, spread=False)  # rows split; count by figures


def test_a_graph_larger_than_the_cluster_is_refused_at_submit(cluster: LocalCluster) -> None:
    from triplane.sdk.tensor import build_graph

    graph, _, _ = build_graph([tp.normal((16384, 16384), seed=1)])  # 1 GiB; 3 x 64 MiB
    doc = graph.to_dict()
    name = graph.outputs[0]
    with _api(cluster) as c:
        before = len(c.get("/v1/jobs").json()["items"])
        r = c.post("/v1/jobs", json={"graph": doc, "fetch": [name]})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["kind"] == "limit" and err["node"] == name and err["op"] == "normal"
        assert "1 GiB" in err["message"] and "total memory" in err["message"]
        assert len(c.get("/v1/jobs").json()["items"]) == before  # never stored, never half-run


# --- the big case -------------------------------------------------------------------------


N = 12288


@pytest.mark.slow
def test_12288_matmul_on_three_768_mib_executors(tmp_path: Path, running_cluster: Any) -> None:
    with running_cluster(tmp_path / "big", bound_s=900.0, executors=3, memory="768MiB") as c:
        s = RemoteSession(c.url, c.token, job_timeout_s=800.0, timeout_s=300.0, poll_s=5.0)
        t0 = time.perf_counter()
        with use_session(s):
            y = (tp.normal((N, N), seed=11) @ tp.normal((N, N), seed=12)).numpy()
        wall = time.perf_counter() - t0
        doc = _plan(c, str(s.last_job))
        s.close()
    span = doc["makespan"]
    print(f"\n12288^2 float32 matmul on 3 x 768 MiB: {wall:.1f} s wall (submit to fetched); "
          f"predicted makespan {span['predicted_s']:.1f} s, actual {span['actual_s']:.1f} s")
    _assert_split(doc, min_tasks=16)
    assert y.shape == (N, N) and y.dtype == np.float32
    rng = np.random.default_rng(3)
    corners = [(0, 0), (N - 8, N - 8), (3068, 6140)]  # edges and a block across tile boundaries
    for r0, c0 in corners + [tuple(int(v) for v in rng.integers(0, N - 8, 2)) for _ in range(3)]:
        rows = np.stack([rnd.standard_normal(11, N, (r0 + i) * N) for i in range(8)])
        cols = np.stack([rnd.standard_normal_at(12, np.arange(N, dtype=np.uint64) * np.uint64(N)
                                                + np.uint64(c0 + j)) for j in range(8)], axis=1)
        # The cluster's inputs are the float32 roundings of these; the reference is float64.
        ref = rows.astype(np.float32).astype(np.float64) @ cols.astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(y[r0:r0 + 8, c0:c0 + 8], ref, rtol=1e-4, atol=2e-3,
                                   err_msg=f"block at {(r0, c0)}")
