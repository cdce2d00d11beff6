"""A model loaded from its file runs on a real local cluster (``tp.connect``'s session) with
the same outputs as in this process, at two batch sizes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from cluster_run import running_cluster  # tests/integration/cluster (this folder's conftest.py)

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("models"), bound_s=300.0, executors=1) as c:
        yield c


def test_loaded_model_runs_on_the_cluster_as_in_process(cluster: LocalCluster, tmp_path: Path) -> None:
    tp.manual_seed(0)
    net = tp.nn.Sequential(tp.nn.Conv2d(1, 4, 3, padding=1), tp.nn.ReLU(), tp.nn.Flatten(),
                           tp.nn.Linear(4 * 6 * 6, 5))
    x = np.random.default_rng(0).normal(size=(8, 1, 6, 6)).astype(np.float32)
    tp.save_model(net, x[:2], tmp_path / "m.tpm")
    model = tp.load_model(tmp_path / "m.tpm")
    local = [model(x[:n]).numpy() for n in (2, 8)]
    session = RemoteSession(cluster.url, cluster.token)
    try:
        with use_session(session):
            remote = [model(x[:n]).numpy() for n in (2, 8)]
            again = model(x[:2]).numpy()  # the parameters were uploaded once; a second call reuses them
    finally:
        session.close()
    for got, want in zip(remote, local):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(again, remote[0])
