"""Values kept on the cluster (``triplane/sdk/remote_values.py``) against the compiling
fake scheduler: an optimiser step keeps parameters, state and gradients there and is ONE
request in steady state; reads fetch; jobs are released once no Tensor holds their values;
checkpoints every N steps; a lost executor is survived from the checkpoint with one
warning, or fails saying there is no checkpoint."""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter
from typing import Any

import httpx
import numpy as np
import pytest
from test_remote_session import TOKEN, URL
from test_remote_steps import CompilingFake

import triplane as tp
from triplane.embedded import EmbeddedSession
from triplane.sdk import nn, optim
from triplane.sdk.nn import functional as F
from triplane.sdk.remote import RemoteError, RemoteSession
from triplane.sdk.remote_values import RemoteValue
from triplane.sdk.session import use_session


@pytest.fixture
def fake() -> CompilingFake:
    return CompilingFake()


def _session(fake: CompilingFake, **kw: Any) -> RemoteSession:
    s = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01, **kw)
    s.keeper.batch_s = 0.0
    return s


class Trainer:
    """A small MLP with Adam, one minibatch per step (the same data for every session)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.xs = rng.standard_normal((64, 16, 4)).astype(np.float32)
        self.ys = rng.integers(0, 3, (64, 16))
        tp.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.opt = optim.Adam(self.model.parameters(), lr=1e-2)
        self.i = 0

    def step(self, read: bool = True) -> Any:
        """One step; its loss (a float; with ``read=False`` the Tensor: the steps pipeline)."""
        loss = F.cross_entropy(self.model(tp.tensor(self.xs[self.i % 64])), tp.tensor(self.ys[self.i % 64]))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.i += 1
        return loss.item() if read else loss


def _wait_released(fake: CompilingFake, jobs: set[str], timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not jobs <= fake.released and time.monotonic() < end:
        time.sleep(0.01)
    assert jobs <= fake.released, f"not released: {sorted(jobs - fake.released)}"


def test_parameters_and_state_stay_on_the_cluster_and_reads_fetch(fake: CompilingFake) -> None:
    s = _session(fake)
    with use_session(s):
        tr = Trainer()
        got = [tr.step() for _ in range(4)]
        assert all(isinstance(p._value, RemoteValue) for p in tr.model.parameters())
        state = [v for st in tr.opt.state for k, v in st.items() if k != "step"]
        assert len(state) == 8 and all(isinstance(v._value, RemoteValue) for v in state)
        assert all(isinstance(p.grad._value, RemoteValue) for p in tr.model.parameters())
        fetched = fake.calls["GET /v1/jobs/*/tensors/*"]
        model_sd, opt_sd = tr.model.state_dict(), tr.opt.state_dict()
        grad0 = tr.model[0].weight.grad.numpy()
        assert fake.calls["GET /v1/jobs/*/tensors/*"] == fetched + 4 + 8 + 1  # each read once
        tr.model.state_dict()
        assert fake.calls["GET /v1/jobs/*/tensors/*"] == fetched + 13  # the host copy is cached
    ref = Trainer()
    with use_session(EmbeddedSession()):
        want = [ref.step() for _ in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for k, v in ref.model.state_dict().items():
        np.testing.assert_allclose(model_sd[k], v, rtol=1e-5, atol=1e-6)
    for i, st in ref.opt.state_dict()["state"].items():
        assert opt_sd["state"][i]["step"] == st["step"] == 4
        np.testing.assert_allclose(opt_sd["state"][i]["exp_avg"], st["exp_avg"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad0, ref.model[0].weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    s.close()


def test_a_steady_state_step_is_one_request_that_releases_the_step_before(fake: CompilingFake) -> None:
    s = _session(fake)
    s.keeper.batch_s = 60.0  # the keeper's own DELETEs would come later than the next submit
    with use_session(s):
        tr = Trainer()
        # Adam's first step is another structure: two graphs, then compiled steps; the first
        # two are pipelined, and as the loop reads each loss before the next step, the rest wait
        for _ in range(4):
            tr.step()
        assert s.counters()["pipelined"] == 2
        before, carried = Counter(fake.calls), fake.carried
        for _ in range(10):
            tr.step()
        holding = {p._value.job_id for p in tr.model.parameters()}
    calls = Counter(fake.calls)
    calls.subtract(before)
    assert +calls == Counter({"POST /v1/jobs": 10}), +calls
    assert all(b.get("wait_s") and b["inline"] for b in fake.bound[-10:])  # the loss comes back inline
    assert fake.carried - carried == 10  # each submit released the job before the one it reads
    unreleased = set(fake.jobs) - fake.released
    assert holding < unreleased and len(unreleased) == 2  # and the step before, queued for the next
    assert [k for k, _ in s.keeper.take(100)].count("jobs") == 1
    s.close()


def test_a_scheduler_without_release_gets_deletes(fake: CompilingFake) -> None:
    """One that refuses the field (400, unknown field) is sent the submit again without it,
    and the releases go as DELETEs from then on; nothing is lost."""
    fake.knows_release = False
    s = _session(fake)
    s.keeper.batch_s = 60.0
    with use_session(s):
        tr = Trainer()
        for _ in range(6):
            tr.step()
        s.keeper.flush()
        holding = {p._value.job_id for p in tr.model.parameters()}
        assert fake.calls["DELETE /v1/jobs/*"] >= 4 and fake.carried == 0
        assert fake.refused_release == 1  # asked once, then never again
        _wait_released(fake, set(fake.jobs) - holding - {max(fake.jobs)})
    s.close()


def test_a_job_is_released_once_no_tensor_holds_its_values(fake: CompilingFake) -> None:
    s = _session(fake)
    with use_session(s):
        tr = Trainer()
        for _ in range(5):
            tr.step()
        holding = {p._value.job_id for p in tr.model.parameters()}
        assert len(holding) == 1  # this step's job holds the new parameters, state and gradients
        _wait_released(fake, set(fake.jobs) - holding)  # every earlier step's job went
        assert not holding & fake.released
        del tr
        gc.collect()
        _wait_released(fake, holding)
    s.close()


def test_a_plain_read_is_one_request_and_releases_its_job(fake: CompilingFake) -> None:
    s = _session(fake)
    with use_session(s):
        x = tp.tensor(np.arange(6, dtype=np.float32))
        np.testing.assert_array_equal((x * 2).numpy(), np.arange(6) * 2)
    assert fake.calls["POST /v1/jobs"] == 1 and fake.calls["GET /v1/jobs/*/tensors/*"] == 0
    assert not any(k.endswith("/wait") for k in fake.calls)
    _wait_released(fake, set(fake.jobs))
    s.close()


def test_disconnect_fetches_what_tensors_still_hold(fake: CompilingFake, monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    from triplane.sdk import session as sess

    s = _session(fake)
    monkeypatch.setattr(sess, "_default", s)
    tr = Trainer()
    for _ in range(3):
        tr.step()
    tp.disconnect()
    assert all(type(p._value) is np.ndarray for p in tr.model.parameters())
    assert all(type(v._value) is np.ndarray for st in tr.opt.state for k, v in st.items() if k != "step")
    loss = tr.step()  # goes on in-process
    assert np.isfinite(loss)


def test_a_value_read_after_close_says_why(fake: CompilingFake) -> None:
    s = _session(fake)
    with use_session(s):
        tr = Trainer()
        tr.step()
    s.close()
    with pytest.raises(RemoteError, match="closed: read values"):
        tr.model.state_dict()


def test_checkpoints_every_n_steps_release_the_previous_copies(fake: CompilingFake) -> None:
    s = _session(fake, checkpoint_every=3)
    with use_session(s):
        tr = Trainer()
        for _ in range(4):
            tr.step()
        assert fake.copies == 1 and s.resident.last is not None and s.resident.last.step == 3
        first = s.resident.last.uploads()
        # parameters and Adam's m and v (the gradients of step 3 were dropped by zero_grad)
        assert len(first) == 4 + 8
        for _ in range(3):
            tr.step()
        s.keeper.flush()
    assert fake.copies == 2 and s.resident.last.step == 6
    deleted = {k.split("/")[-1] for k in fake.calls if k.startswith("DELETE /v1/tensors/")}
    deleted |= fake.released_uploads  # carried by the next step's submit (its "release")
    assert first <= deleted and not deleted & s.resident.last.uploads()
    s.close()


def test_a_lost_executor_goes_back_to_the_checkpoint_with_one_warning(
        fake: CompilingFake, caplog: pytest.LogCaptureFixture) -> None:
    s = _session(fake, checkpoint_every=4)
    with use_session(s):
        tr = Trainer()
        losses = [tr.step() for _ in range(6)]
        at_checkpoint = _copies(fake, s, list(tr.model.parameters()))
        fake.lost_jobs.update(fake.jobs)  # the executor holding every kept value died
        with caplog.at_level(logging.WARNING, logger="triplane.sdk.remote"):
            losses += [tr.step() for _ in range(4)]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "checkpoint of step 4, 2 step(s) lost" in warnings[0], warnings
    assert all(np.isfinite(losses)) and s.resident.restores == 1
    # the step after the loss read the checkpoint's copies (the values after step 4)
    ref = Trainer()
    with use_session(EmbeddedSession()):
        for _ in range(4):
            ref.step()
        want = [p.numpy() for p in ref.model.parameters()]
    for got, w in zip(at_checkpoint, want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    s.close()


def test_a_pipelined_step_lost_in_flight_runs_again_from_the_checkpoint(
        fake: CompilingFake, caplog: pytest.LogCaptureFixture) -> None:
    """The executor dies while step 6 is in flight (pipelined): step 7's submit is answered
    ``lost`` and step 6's loss cannot be read. The session goes back to the checkpoint of
    step 4, runs step 6 again from there, then step 7: every loss reads, and the values are
    those of steps 1-4, 6, 7, ... (step 5 is the one lost)."""
    s = _session(fake, checkpoint_every=4)
    with use_session(s):
        tr = Trainer()
        losses = [tr.step(read=False) for _ in range(6)]
        assert s.steps.pipe.inflight is not None
        fake.lost_jobs.update(fake.jobs)  # the executor holding every kept value died
        fake.lose_fetches = 1  # ... and step 6's loss with it
        with caplog.at_level(logging.WARNING, logger="triplane.sdk.remote"):
            losses += [tr.step(read=False) for _ in range(4)]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "checkpoint of step 4, 1 step(s) lost" in warnings[0], warnings
        assert s.steps.pipe.redone == 1 and s.resident.restores == 1
        got_losses = [float(t.item()) for t in losses]
        got = [np.array(p.numpy()) for p in tr.model.parameters()]
    ref = Trainer()
    with use_session(EmbeddedSession()):
        want_losses = [ref.step() for _ in range(4)]
        ref.i += 1  # step 5: lost on the cluster, though its Python ran: Adam's count has it
        for st in ref.opt.state:
            st["step"] += 1
        want_losses += [ref.step() for _ in range(5)]
        want = [p.numpy() for p in ref.model.parameters()]
    np.testing.assert_allclose(got_losses[:4], want_losses[:4], rtol=1e-5)
    np.testing.assert_allclose(got_losses[5:], want_losses[4:], rtol=1e-5)  # step 6 as run again
    assert np.isfinite(got_losses[4])  # step 5's, read before the loss
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    s.close()


def _copies(fake: CompilingFake, s: RemoteSession, tensors: list[tp.Tensor]) -> list[np.ndarray]:
    """The checkpoint's copies of ``tensors``, as the fake stores them."""
    assert s.resident.last is not None
    of = {id(wt()): uid for wt, uid, _ in s.resident.last.entries}
    return [fake.tensors[of[id(t)]] for t in tensors]


def test_a_lost_executor_before_the_first_checkpoint_says_so(fake: CompilingFake) -> None:
    s = _session(fake, checkpoint_every=50)
    with use_session(s):
        tr = Trainer()
        for _ in range(3):
            tr.step()
        fake.lost_jobs.update(fake.jobs)
        with pytest.raises(RemoteError, match=r"no checkpoint to go on from yet .* after 50 optimiser steps"):
            tr.step()
    s.close()


def test_a_restored_value_reads_back(fake: CompilingFake) -> None:
    s = _session(fake, checkpoint_every=2)
    with use_session(s):
        tr = Trainer()
        for _ in range(3):
            tr.step()
        fake.lost_jobs.update(fake.jobs)
        w = tr.model[0].weight
        s.resident.restore(RemoteError("lost", kind="lost"), in_step=False)
        assert isinstance(w._value, RemoteValue) and w._value.ref.startswith("u-")
        np.testing.assert_array_equal(w.numpy(), _copies(fake, s, [w])[0])
    s.close()


def test_without_the_copy_request_checkpoints_are_downloaded(fake: CompilingFake,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    fake.can_copy = False
    s = _session(fake, checkpoint_every=3)
    with use_session(s), caplog.at_level(logging.WARNING, logger="triplane.sdk.remote"):
        tr = Trainer()
        for _ in range(5):
            tr.step()
        assert s.resident.last is not None and not s.resident.last.uploads()
        held = {id(wt()): v for wt, v, _ in s.resident.last.entries}
        w = tr.model[0].weight
        want = np.array(held[id(w)])
        fake.lost_jobs.update(fake.jobs)
        losses = [tr.step() for _ in range(3)]
    assert all(np.isfinite(losses)) and s.resident.restores == 1
    assert any("checkpoints are downloaded instead" in r.getMessage() for r in caplog.records)
    assert any("checkpoint of step 3, 2 step(s) lost" in r.getMessage() for r in caplog.records)
    assert want.shape == (8, 4) and isinstance(w._value, RemoteValue)  # trained on from there
    s.close()
