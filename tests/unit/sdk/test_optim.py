"""Optimizers against hand-computed numpy updates (torch's rules), one graph run a step."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.sdk import session as session_mod
from triplane.sdk.optim import SGD, Adam, add_pending_update, flush_pending_updates
from triplane.sdk.tensor import Tensor
from triplane.testing import assert_close

# float32 parameters vs a float64 reference over a few steps
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def _params(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.uniform(-1, 1, size=s).astype(np.float32) for s in ((3, 4), (4,))]


def _grads(rng: np.random.Generator, like: list[np.ndarray]) -> list[np.ndarray]:
    return [rng.uniform(-1, 1, size=p.shape).astype(np.float32) for p in like]


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.8, 0.01)])
def test_sgd_matches_numpy(seed: int, momentum: float, weight_decay: float) -> None:
    rng = np.random.default_rng(seed)
    init = _params(rng)
    ps = [Tensor.from_array(p, requires_grad=True) for p in init]
    opt = SGD(ps, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    ref = [p.astype(np.float64) for p in init]
    bufs: list[np.ndarray | None] = [None, None]
    for step in range(3):
        gs = _grads(rng, init)
        for p, g in zip(ps, gs):
            p.grad = Tensor.from_array(g)
        opt.step()
        for i, g in enumerate(gs):
            d = g.astype(np.float64) + weight_decay * ref[i]
            if momentum:
                bufs[i] = d if bufs[i] is None else momentum * bufs[i] + d
                d = bufs[i]
            ref[i] = ref[i] - 0.1 * d
        for i, p in enumerate(ps):
            assert_close(p.numpy(), ref[i], rtol=RTOL, atol=ATOL, what=f"seed={seed} step={step} param={i}")


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_adam_matches_numpy(seed: int, weight_decay: float) -> None:
    rng = np.random.default_rng(seed)
    init = _params(rng)
    ps = [Tensor.from_array(p, requires_grad=True) for p in init]
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-8
    opt = Adam(ps, lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay)
    ref = [p.astype(np.float64) for p in init]
    m = [np.zeros_like(r) for r in ref]
    v = [np.zeros_like(r) for r in ref]
    for t in range(1, 5):
        gs = _grads(rng, init)
        for p, g in zip(ps, gs):
            p.grad = Tensor.from_array(g)
        opt.step()
        for i, g in enumerate(gs):
            d = g.astype(np.float64) + weight_decay * ref[i]
            m[i] = b1 * m[i] + (1 - b1) * d
            v[i] = b2 * v[i] + (1 - b2) * d * d
            ref[i] = ref[i] - lr * (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + eps)
        for i, p in enumerate(ps):
            assert_close(p.numpy(), ref[i], rtol=RTOL, atol=ATOL, what=f"seed={seed} step={t} param={i}")


def test_step_is_one_graph_run_and_reuses_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    flush_pending_updates()  # updates another test's BatchNorm may have left would add outputs
    sess = session_mod.current_session()
    calls: list[int] = []
    real = sess.evaluate

    def counting(outputs: list[Tensor]) -> list[np.ndarray]:
        calls.append(len(outputs))
        return real(outputs)

    monkeypatch.setattr(sess, "evaluate", counting)
    rng = np.random.default_rng(0)
    ps = [Tensor.from_array(p, requires_grad=True) for p in _params(rng)]
    x = Tensor.from_array(rng.standard_normal((5, 3)).astype(np.float32))
    opt = Adam(ps, lr=0.01)
    hits = []
    for _ in range(4):
        loss = ((x @ ps[0] + ps[1]) * (x @ ps[0] + ps[1])).mean()
        opt.zero_grad()
        loss.backward()
        calls.clear()
        before = sess.traces.hits
        opt.step()
        hits.append(sess.traces.hits - before)
        assert len(calls) == 1, f"step() ran {len(calls)} graphs"
        # the loss backward() ran on, two gradients, two new parameters, their m and v
        assert calls[0] == 1 + 2 + 2 + 2 * 2
    # from step 2 on (when m and v exist) every step has the same graph, because the
    # step-dependent bias corrections are inputs: steps 3 and 4 replay the compiled step
    assert hits[2:] == [1, 1]


def test_parameters_without_grad_are_untouched() -> None:
    a = Tensor.from_array(np.ones(3, np.float32), requires_grad=True)
    b = Tensor.from_array(np.ones(3, np.float32), requires_grad=True)
    a.grad = Tensor.from_array(np.full(3, 2.0, np.float32))
    SGD([a, b], lr=0.5).step()
    assert_close(a.numpy(), np.zeros(3))
    assert_close(b.numpy(), np.ones(3))


def test_zero_grad_and_bad_arguments() -> None:
    p = Tensor.from_array(np.ones(2, np.float32), requires_grad=True)
    p.grad = Tensor.from_array(np.ones(2, np.float32))
    opt = SGD([p], lr=0.1)
    opt.zero_grad()
    assert p.grad is None
    with pytest.raises(ValueError, match=r"lr > 0.*lr=0\.0"):
        SGD([p], lr=0.0)
    with pytest.raises(ValueError, match="betas"):
        Adam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="int64"):
        SGD([Tensor.from_array(np.ones(2, np.int64))], lr=0.1)


def test_pending_updates_are_realized_with_the_step() -> None:
    p = Tensor.from_array(np.ones(2, np.float32), requires_grad=True)
    stat = Tensor.from_array(np.zeros(2, np.float32))
    add_pending_update(stat, stat + 5.0)
    add_pending_update(stat, stat + 3.0)  # replaces the first
    p.grad = Tensor.from_array(np.ones(2, np.float32))
    SGD([p], lr=1.0).step()
    assert_close(stat.numpy(), np.full(2, 3.0))
    assert_close(p.numpy(), np.zeros(2))
    add_pending_update(stat, stat * 2.0)
    flush_pending_updates()
    assert_close(stat.numpy(), np.full(2, 6.0))


def test_step_realizes_the_loss_and_gradients_before_assigning() -> None:
    # Parameters change in place: the loss and gradients must be those of the old values.
    p = Tensor.from_array(np.array([1.0, 2.0], np.float32), requires_grad=True)
    loss = (p * p).sum()
    loss.backward()
    g = p.grad
    assert g is not None
    SGD([p], lr=0.25).step(loss)
    assert_close(p.numpy(), np.array([0.5, 1.0]))
    assert_close(loss.numpy(), np.array(5.0))  # not 1.25, the loss at the new values
    assert_close(g.numpy(), np.array([2.0, 4.0]))
