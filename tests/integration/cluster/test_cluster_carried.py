"""A compiled step's small inputs ride in its task packet and its small outputs in the reply
(proto/packet.md, "Carried values"), on a real local cluster: the executors pull nothing
from the scheduler for the steps and serve nothing back, the bytes carried are counted, and
the values equal numpy's on fresh inputs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cluster_memory import settled_stats
from cluster_run import running_cluster

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("carried"), bound_s=240.0, executors=2) as c:
        yield c


def _sum(stats: dict[str, dict[str, Any]], key: str) -> int:
    return sum(int(s.get(key, 0)) for s in stats.values())


def test_a_compiled_steps_small_inputs_are_carried_not_pulled(cluster: LocalCluster) -> None:
    rng = np.random.default_rng()
    w = rng.standard_normal((32, 8)).astype(np.float32)

    def step(x: np.ndarray) -> np.ndarray:
        return (tp.tensor(x) @ tp.tensor(w)).tanh().sum(axis=1).numpy()

    with RemoteSession(cluster.url, cluster.token) as s, use_session(s):
        for _ in range(3):  # the first submit compiles the structure; the rest are compiled steps
            step(rng.standard_normal((16, 32)).astype(np.float32))
        before = settled_stats(cluster)
        xs = [rng.standard_normal((16, 32)).astype(np.float32) for _ in range(5)]
        for x in xs:
            np.testing.assert_allclose(step(x), np.tanh(x @ w).sum(axis=1), rtol=1e-5, atol=1e-6)
        assert s.counters()["trace_hits"] >= 5
        after = settled_stats(cluster)
    carried = _sum(after, "tasks_carried_bytes") - _sum(before, "tasks_carried_bytes")
    pulls = _sum(after, "tasks_upload_pulls") - _sum(before, "tasks_upload_pulls")
    served = sum(s["data_port"]["bytes_out"] for s in after.values()) - \
        sum(s["data_port"]["bytes_out"] for s in before.values())
    # Each step carried its minibatch and the weights (sent inline: a new upload each step).
    assert carried == 5 * (xs[0].nbytes + w.nbytes), (carried, before, after)
    assert pulls == 0, (before, after)
    # Each step's result (16 float32) came back in its task's reply: no executor served a byte.
    assert served == 0, (before, after)
