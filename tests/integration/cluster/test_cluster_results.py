"""The same graphs give the same results embedded and on clusters of 2 and 3 executor
processes (a scheduler and executors on loopback, through ``tp.connect``'s session)."""

from __future__ import annotations

import numpy as np
import pytest
from cluster_graphs import GRAPHS

import triplane as tp
from triplane.embedded import EmbeddedSession
from triplane.launcher import LocalCluster
from triplane.proto.errors import KernelError, ShapeError
from triplane.sdk.remote import RemoteError, RemoteSession
from triplane.sdk.session import use_session


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_cluster_results_equal_embedded(name: str, remote: RemoteSession) -> None:
    want = EmbeddedSession().evaluate(GRAPHS[name]())
    with use_session(remote):
        outs = GRAPHS[name]()
        tp.realize(*outs)
        got = [o.numpy() for o in outs]
    assert remote.last_stats["job"] is not None  # it really ran on the cluster
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, i)
        if name == "random" or g.dtype.kind in "iub":
            # seeded by tensor id, integer or boolean: exactly the same values
            np.testing.assert_array_equal(g, w, err_msg=f"{name} output {i}")
        else:
            # the same numpy kernels, but BLAS may sum in another order (threads per process)
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-7, err_msg=f"{name} output {i}")


def test_training_steps_match_embedded(remote: RemoteSession) -> None:
    from triplane.demo import run_demo

    want = run_demo(steps=4, seed=5)
    with use_session(remote):
        got = run_demo(steps=4, seed=5)
    assert got == want and got[-1] < got[0]


def test_work_is_spread_over_the_executors(cluster: LocalCluster, remote: RemoteSession) -> None:
    nodes = cluster.registered()
    assert {n["pid"] for n in nodes} == {p.pid for p in cluster.executors}
    assert len(nodes) == len(cluster.executors)


def test_errors_come_back_as_sdk_errors(cluster: LocalCluster, remote: RemoteSession) -> None:
    x = tp.Tensor.from_array(np.array([1.0, 2.0]))
    idx = tp.Tensor.from_array(np.array([0, 7]))
    bad = tp.gather(x, idx, axis=0)  # index 7 is out of range: the kernel raises remotely
    with use_session(remote), pytest.raises(KernelError) as info:
        bad.numpy()
    msg = str(info.value)
    assert info.value.kind == "user" and info.value.op == "gather" and "out of range" in msg
    assert f"{__file__}:" in msg
    # a malformed graph never reaches an executor: 400 naming the node
    doc = {"version": 1, "outputs": ["n2"], "nodes": {
        "n0": {"op": "full", "shape": [2, 3], "dtype": "float32", "attrs": {"value": 1.0, "shape": [2, 3],
                                                                           "dtype": "float32"}},
        "n1": {"op": "full", "shape": [4, 5], "dtype": "float32", "attrs": {"value": 1.0, "shape": [4, 5],
                                                                           "dtype": "float32"}},
        "n2": {"op": "matmul", "inputs": ["n0", "n1"], "shape": [2, 5], "dtype": "float32"}}}
    with pytest.raises((ShapeError, tp.GraphError)) as ginfo:
        remote.submit(doc, ["n2"])
    assert ginfo.value.node == "n2"


def test_a_wrong_token_is_refused_clearly(cluster: LocalCluster) -> None:
    with pytest.raises(RemoteError, match="refused the API token") as info:
        tp.connect(cluster.url, "not-the-token")
    assert info.value.status == 401
    with RemoteSession(cluster.url, None) as anonymous, pytest.raises(RemoteError, match="token"):
        anonymous.evaluate([tp.Tensor.from_array(np.ones(2)) * 2.0])
