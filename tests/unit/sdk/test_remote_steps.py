"""Compiled steps on a cluster (``triplane/sdk/remote_steps.py``), against the fake
scheduler of test_remote_session.py taught the compiled-step request: a structure sent
once as a graph is then sent as ``{"plan", "args", "fetch"}`` with small inputs inline,
values equal the embedded session's, and a scheduler that forgot the plan (409
``unknown_plan``) gets the graph again."""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

import httpx
import numpy as np
import pytest
from test_remote_session import TOKEN, URL, FakeScheduler

import triplane as tp
from triplane.embedded import EmbeddedSession
from triplane.proto import dtypes as dt
from triplane.proto.infer import graph_from_wire
from triplane.sdk import nn, optim
from triplane.sdk.nn import functional as F
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session


class CompilingFake(FakeScheduler):
    """Answers a graph submit with ``plan`` and ``args`` and runs compiled-step requests."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: dict[str, tuple[dict[str, Any], list[str]]] = {}
        self.bound: list[dict[str, Any]] = []
        self.made = 0

    def _submit(self, body: dict[str, Any]) -> httpx.Response:
        if "plan" in body:
            self.bound.append(body)
            if body["plan"] not in self.plans:
                return httpx.Response(409, json={"error": {"kind": "unknown_plan",
                                                           "message": "unknown plan: submit the graph"}})
            doc, arg_nodes = self.plans[body["plan"]]
            doc = copy.deepcopy(doc)
            for nid, a in zip(arg_nodes, body["args"], strict=True):
                doc["nodes"][nid]["attrs"]["tensor"] = a if isinstance(a, str) else self._inline(a)
            rest = {k: v for k, v in body.items() if k not in ("plan", "args", "await_refs_s", "inline_refs")}
            r = super()._submit({"graph": doc, **rest})
            if body.get("inline_refs") and r.status_code == 201:  # the step before's values, inline
                values = {}
                for ref in body["inline_refs"]:
                    job, _, name = ref.partition(":")
                    arr = self.jobs[job]["_values"][name]
                    values[ref] = {"shape": list(arr.shape), "dtype": dt.dtype(arr.dtype).name,
                                   "data": base64.b64encode(arr.astype(arr.dtype.newbyteorder("<"))
                                                            .tobytes()).decode()}
                r = httpx.Response(201, json={**r.json(), "ref_values": values})
            return r
        r = super()._submit(body)
        _, _, args = graph_from_wire(body["graph"]).canonical()
        by_tensor = {n["attrs"]["tensor"]: nid for nid, n in body["graph"]["nodes"].items()
                     if n["op"] == "input"}
        key, self.made = f"p{self.made}", self.made + 1
        self.plans[key] = (body["graph"], [by_tensor[a] for a in args])
        return httpx.Response(201, json={**r.json(), "plan": key, "args": args})

    def _inline(self, a: dict[str, Any]) -> str:
        d = dt.dtype(a["dtype"])
        tid = f"u-{len(self.tensors):032x}"
        self.tensors[tid] = np.frombuffer(base64.b64decode(a["data"]), dtype=d.np).reshape(a["shape"])
        return tid


@pytest.fixture
def fake() -> CompilingFake:
    return CompilingFake()


def _train(session: Any, steps: int, read_each_step: bool = True,
           before_reading: Any = None) -> tuple[list[float], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((steps, 16, 4)).astype(np.float32)
    ys = rng.integers(0, 3, (steps, 16))
    tp.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    with use_session(session):
        for i in range(steps):
            loss = F.cross_entropy(model(tp.tensor(xs[i])), tp.tensor(ys[i]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item() if read_each_step else loss)
        if before_reading is not None:
            before_reading(losses)
        return [float(x) for x in losses], [np.array(p.numpy()) for p in model.parameters()]


def test_a_known_structure_is_one_small_request_with_inline_inputs(fake: CompilingFake) -> None:
    remote = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    got_losses, got_params = _train(remote, 5)
    want_losses, want_params = _train(EmbeddedSession(), 5)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-6)
    for g, w in zip(got_params, want_params):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    # Adam's first step differs from the others: two graphs, then three compiled steps; the
    # loop reads each step's loss, so two are pipelined, then the structure runs synchronously
    assert remote.counters() == {"trace_hits": 3, "trace_misses": 2, "unknown_plan": 0, "pipelined": 2}
    assert len(fake.bound) == 3
    uploads_after_graphs = fake.calls["POST /v1/tensors"]
    # small host inputs inline; parameters and Adam's state kept on the cluster, bound by ref
    assert all(isinstance(a, dict) or re.fullmatch(r"j\w+:n\d+", a) for b in fake.bound for a in b["args"])
    assert sum(isinstance(a, str) for a in fake.bound[-1]["args"]) == 3 * 4  # 4 params, m, v
    _train(remote, 0)
    assert fake.calls["POST /v1/tensors"] == uploads_after_graphs
    remote.close()


@pytest.mark.parametrize("pipeline", [True, False])
def test_pipelined_steps_give_the_synchronous_values(fake: CompilingFake, pipeline: bool) -> None:
    """A loop that reads its losses at the end: every compiled step is submitted without
    waiting (nothing inline; the step before bound by ref with await_refs_s), unless the
    session says ``pipeline=False``; the values are the embedded session's either way."""
    remote = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01,
                           pipeline=pipeline)
    got_losses, got_params = _train(remote, 8, read_each_step=False)
    want_losses, want_params = _train(EmbeddedSession(), 8)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-6)
    for g, w in zip(got_params, want_params):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    assert remote.counters()["trace_hits"] == 6
    assert remote.counters()["pipelined"] == (6 if pipeline else 0)
    for b in fake.bound:
        assert ("await_refs_s" in b) == pipeline and ("wait_s" in b) != pipeline, sorted(b)
    remote.close()


def test_a_pipelined_loop_keeps_its_losses_as_arrays_and_sends_one_request_a_step(
        fake: CompilingFake) -> None:
    """Each step's answer carries the loss of the step before (``inline_refs``): a loop that
    keeps its loss Tensors holds arrays, not jobs, and fetches nothing; every job but the
    one in flight's is released (carried on a later submit)."""
    remote = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    kinds: list[str] = []
    fetched: list[int] = []

    def check(losses: list[Any]) -> None:  # before any is read
        kinds.extend(type(t._value).__name__ for t in losses)
        fetched.append(fake.calls["GET /v1/jobs/*/tensors/*"])

    got_losses, got_params = _train(remote, 10, read_each_step=False, before_reading=check)
    want_losses, want_params = _train(EmbeddedSession(), 10)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-6)
    for g, w in zip(got_params, want_params, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    assert kinds[:-1] == ["ndarray"] * 9 and kinds[-1] == "RemoteValue", kinds
    assert fetched == [0]  # the values came with the answers
    assert remote.counters()["pipelined"] == 8
    assert [b.get("inline_refs") is not None for b in fake.bound] == [False] + [True] * 7
    remote.keeper.flush()
    assert len([j for j in fake.jobs if j not in fake.released]) <= 2  # in flight, and the last read
    remote.close()


def test_a_loop_that_stops_reading_every_loss_is_pipelined_again(fake: CompilingFake,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two steps whose loss was read before the next: that structure runs synchronously
    for SYNC_STEPS steps (3 here), then is pipelined again; reads going on switch it back."""
    from triplane.sdk import remote_pipeline

    monkeypatch.setattr(remote_pipeline, "SYNC_STEPS", 3)
    remote = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    tp.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    x, y = np.ones((8, 4), np.float32), np.zeros(8, np.int64)
    piped = []
    with use_session(remote):
        for i in range(16):
            loss = F.cross_entropy(model(tp.tensor(x)), tp.tensor(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i < 8:
                loss.item()  # read before the next step
            piped.append(remote.counters()["pipelined"])
    steps = np.diff([0, *piped]).tolist()  # 1: this step was pipelined
    # two graphs; two pipelined steps read at once; 3 synchronous; one pipelined, read (the
    # reads count again from zero)... then reads stop: pipelined from the next try on
    assert steps[:2] == [0, 0] and steps[2:4] == [1, 1] and steps[4:7] == [0, 0, 0], steps
    assert steps[-4:] == [1, 1, 1, 1], steps
    remote.close()


def test_a_compiled_step_whose_output_was_lost_runs_again(fake: CompilingFake) -> None:
    remote = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01, wait_s=0)
    w = tp.tensor(np.ones((3, 2), np.float32))
    with use_session(remote):
        for i in range(2):
            np.testing.assert_array_equal((tp.tensor(np.full((4, 3), i, np.float32)) @ w).numpy(), 3 * i)
        fake.lose_fetches = 1  # the executor holding the output died after the step ended
        np.testing.assert_array_equal((tp.tensor(np.full((4, 3), 5, np.float32)) @ w).numpy(), 15)
    assert [b["plan"] for b in fake.bound] == ["p0", "p0", "p0"]  # the step twice, still compiled
    remote.close()


def test_a_forgotten_plan_falls_back_to_the_graph(fake: CompilingFake) -> None:
    remote = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    w = tp.tensor(np.ones((3, 2), np.float32))
    with use_session(remote):
        for i in range(2):
            np.testing.assert_array_equal((tp.tensor(np.full((4, 3), i, np.float32)) @ w).numpy(), 3 * i)
        fake.plans.clear()  # a restarted scheduler
        np.testing.assert_array_equal((tp.tensor(np.full((4, 3), 5, np.float32)) @ w).numpy(), 15)
        np.testing.assert_array_equal((tp.tensor(np.full((4, 3), 6, np.float32)) @ w).numpy(), 18)
    assert remote.counters() == {"trace_hits": 3, "trace_misses": 1, "unknown_plan": 1, "pipelined": 0}
    assert [b["plan"] for b in fake.bound] == ["p0", "p0", "p1"]
    remote.close()


def test_big_inputs_are_uploaded_once_not_inlined(fake: CompilingFake) -> None:
    remote = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    big = tp.tensor(np.ones((200, 100), np.float32))  # 80 KB: over the inline limit
    with use_session(remote):
        for i in range(3):
            (big * tp.tensor(np.float32(i))).sum().numpy()
    assert remote.counters()["trace_hits"] == 2
    assert all(isinstance(b["args"][0], str) or isinstance(b["args"][1], str) for b in fake.bound)
    assert fake.calls["POST /v1/tensors"] == 2  # the big one once, the first scalar once
    remote.close()
