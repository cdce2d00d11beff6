"""Resident parameters on a real local cluster (issue 12; docs/training.md "On a cluster"):
an optimiser step keeps parameters, Adam's state and gradients on the executors and is one
request in steady state, with the same losses as in-process; old steps' jobs are released;
and a run whose holder executor is SIGKILLed goes on from its checkpoint with one warning,
the loss still decreasing."""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import triplane as tp
from triplane.embedded import EmbeddedSession
from triplane.launcher import ClusterConfig, LocalCluster
from triplane.sdk import nn, optim
from triplane.sdk.nn import functional as F
from triplane.sdk.remote import RemoteSession
from triplane.sdk.remote_values import RemoteValue
from triplane.sdk.session import use_session


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    pytest.importorskip("uvicorn", reason="the cluster extra is not installed")
    c = LocalCluster(tmp_path_factory.mktemp("resident"), ClusterConfig(executors=2, memory="256MiB",
                                                                        ready_timeout_s=60.0))
    try:
        c.start()
        yield c
    finally:
        c.stop(grace_s=3.0)
        c.run.clear_cluster()


class Trainer:
    """MLP 64-128-10 with Adam on fixed random minibatches (the same in every session)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.xs = rng.standard_normal((8, 64, 64)).astype(np.float32)
        self.ys = (self.xs[:, :, :10].argmax(axis=2)).astype(np.int64)  # learnable
        tp.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        self.opt = optim.Adam(self.model.parameters(), lr=1e-2)
        self.i = 0

    def step(self, read: bool = True) -> Any:
        """One step; its loss (a float; with ``read=False`` the Tensor, read later)."""
        x, y = tp.tensor(self.xs[self.i % 8]), tp.tensor(self.ys[self.i % 8])
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.i += 1
        return loss.item() if read else loss


def _counting(s: RemoteSession) -> Counter[str]:
    """Requests the session sends for this (the training) thread, by method and route: from
    it, or from the helper thread its waiting submits run on (not the keeper's releases)."""
    import re
    import threading

    calls: Counter[str] = Counter()
    me = threading.get_ident()

    def hook(request: httpx.Request) -> None:
        if threading.get_ident() == me or threading.current_thread().name.startswith("triplane-submit"):
            route = re.sub(r"/(j[0-9a-f]+|u-[0-9a-f]+|n[0-9]+)", "/*", request.url.path)
            calls[f"{request.method} {route}"] += 1

    s._client.event_hooks["request"].append(hook)
    if s._wire is not None:  # job submits go on the session's own connections (remote_wire.py)
        post = s._wire.post

        def counted(path: str, content: bytes, *a: Any, **kw: Any) -> Any:
            hook(httpx.Request("POST", s.url + path, content=content))
            return post(path, content, *a, **kw)

        s._wire.post = counted  # type: ignore[method-assign]
    return calls


def test_a_training_step_is_one_request_and_keeps_values_on_the_cluster(cluster: LocalCluster) -> None:
    s = RemoteSession(cluster.url, cluster.token)
    calls = _counting(s)
    try:
        with use_session(s):
            tr = Trainer()
            # two graphs (Adam's first step is another structure), then compiled steps: the
            # first two pipelined; as the loop reads each loss before the next, the rest wait
            losses = [tr.step() for _ in range(4)]
            assert s.counters()["pipelined"] == 2
            calls.clear()
            losses += [tr.step() for _ in range(9)]
            steady = Counter({k: v for k, v in calls.items()})
            assert all(isinstance(p._value, RemoteValue) for p in tr.model.parameters())
            jobs = {p._value.job_id for p in tr.model.parameters()}
            sd = tr.model.state_dict()
        assert steady == Counter({"POST /v1/jobs": 9}), steady  # the loss comes back inline
        assert len(jobs) == 1
        ref = Trainer()
        with use_session(EmbeddedSession()):
            want = [ref.step() for _ in range(13)]
        np.testing.assert_allclose(losses, want, rtol=1e-4)
        for k, v in ref.model.state_dict().items():
            np.testing.assert_allclose(sd[k], v, rtol=1e-4, atol=1e-5)
        s.keeper.flush()
        with httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"}) as h:
            states = {j: h.get(f"/v1/jobs/{j}").status_code for j in jobs}
        assert set(states.values()) == {200}  # the job holding the parameters is kept
    finally:
        s.close()


@pytest.mark.slow  # about a minute on 2 loaded cores
@pytest.mark.parametrize("read", [True, False], ids=["read-each-step", "pipelined"])
def test_training_survives_the_sigkill_of_the_executor_holding_its_values(
        tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture, read: bool) -> None:
    """Reading each loss (the steps then wait for their jobs) or keeping the loss Tensors
    to read at the end (pipelined steps: the next step's submit finds the loss)."""
    pytest.importorskip("uvicorn", reason="the cluster extra is not installed")
    c = LocalCluster(tmp_path_factory.mktemp("resident-kill"), ClusterConfig(executors=2, memory="256MiB",
                                                                             ready_timeout_s=60.0))
    c.start()
    s = RemoteSession(c.url, c.token, checkpoint_every=10)
    try:
        with use_session(s), caplog.at_level(logging.WARNING, logger="triplane.sdk.remote"):
            tr = Trainer()
            losses = [tr.step(read) for _ in range(25)]
            pid = c.kill_executor(_holder(c), signal.SIGKILL)
            losses += [tr.step(read) for _ in range(25)]
            if not read:
                assert s.counters()["pipelined"] >= 40
                # each kept loss holds an array, not its step's job (the next step's answer
                # carried it): only the step in flight's is still on the cluster
                assert sum(isinstance(x._value, RemoteValue) for x in losses) <= 1
                losses = [float(x.item()) for x in losses]
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                    and "checkpoint of step" in r.getMessage()]
        assert len(warnings) == 1, (pid, warnings)
        assert "checkpoint of step 20, 5 step(s) lost" in warnings[0], warnings
        assert s.resident.restores == 1
        assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses
        assert all(isinstance(p._value, RemoteValue) for p in tr.model.parameters())
    finally:
        s.close()
        c.stop(grace_s=3.0)
        c.run.clear_cluster()


def _holder(c: LocalCluster) -> int:
    """The executor holding the most bytes (the kept values of the last step; executors
    publish their free bytes about every second)."""
    time.sleep(2.5)
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.token}"}) as h:
        nodes = h.get("/v1/nodes").json()["items"]
    nodes = nodes["nodes"] if isinstance(nodes, dict) else nodes
    used = {n["node"]: n["memory"]["capacity"] - n["memory"]["free"] for n in nodes}
    busiest = max(used, key=lambda k: used[k])
    assert used[busiest] > 0, used
    return int(busiest.rsplit("-", 1)[1])


def test_the_resident_values_example_of_the_cluster_docs_runs(cluster: LocalCluster,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import re
    from pathlib import Path

    from triplane.sdk import session as sess

    doc = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"
    text = doc.read_text()
    section = text[text.index("### Resident values"):]
    section = section[:section.index("\n## ")]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.setenv("TRIPLANE_URL", cluster.url)
    monkeypatch.setenv("TRIPLANE_TOKEN", cluster.token)
    monkeypatch.setattr(sess, "_default", None)
    ns: dict[str, Any] = {"__name__": "__docs__"}
    exec(compile(block, str(doc), "exec"), ns)
    loss = float(capsys.readouterr().out.split("loss ")[1])
    assert loss < 0.5 * np.log(4), loss  # learnt something
    assert sorted(ns["weights"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    resident = ns["session"].resident
    assert resident.last is not None and resident.last.step == 40
    assert all(type(p._value) is np.ndarray for p in ns["model"].parameters())  # fetched at disconnect
