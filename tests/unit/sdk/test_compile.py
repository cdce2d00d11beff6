"""Compiled steps in the embedded session: the trace cache keyed by the recorded graph's
structure (``triplane/sdk/compile.py``) and ``tp.compile``."""

from __future__ import annotations

import numpy as np
import pytest

import triplane as tp
from triplane import nn, optim
from triplane.embedded import EmbeddedSession
from triplane.proto.errors import KernelError
from triplane.sdk.compile import signature
from triplane.sdk.session import use_session


def _train(session: EmbeddedSession | None, steps: int) -> tuple[list[float], list[np.ndarray]]:
    """Adam on a tiny MLP; the losses and final parameters. ``session=None``: a fresh
    session every step, so every step is compiled from scratch."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((steps, 16, 8)).astype(np.float32)
    ys = rng.integers(0, 3, (steps, 16))
    tp.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for i in range(steps):
        with use_session(session or EmbeddedSession()):
            loss = nn.functional.cross_entropy(model(tp.tensor(xs[i])), tp.tensor(ys[i]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, [np.array(p.numpy()) for p in model.parameters()]


def test_compiled_steps_equal_uncompiled_over_several_optimiser_steps() -> None:
    s = EmbeddedSession()
    got_losses, got_params = _train(s, 6)
    want_losses, want_params = _train(None, 6)
    assert got_losses == want_losses  # the same kernels on the same values: bit for bit
    assert len(set(got_losses)) == 6  # the parameters did change step after step
    for g, w in zip(got_params, want_params):
        np.testing.assert_array_equal(g, w)
    c = s.counters()
    # Adam's first step has no moments yet: its graph differs from the later ones'
    assert c["trace_misses"] == 2 and c["trace_hits"] == 4, c
    assert c["plan_misses"] == 2 and c["plan_hits"] == 0, c  # a hit never reaches the plan cache


def test_a_structure_change_compiles_again() -> None:
    s = EmbeddedSession()
    with use_session(s):
        for _ in range(2):
            (tp.tensor(np.ones((2, 3), np.float32)) * 2).numpy()
        assert s.counters()["trace_misses"] == 1 and s.counters()["trace_hits"] == 1
        np.testing.assert_array_equal((tp.tensor(np.ones((4, 3), np.float32)) * 2).numpy(), 2)  # shape
        np.testing.assert_array_equal((tp.tensor(np.ones((2, 3), np.float64)) * 2).numpy(), 2)  # dtype
        np.testing.assert_array_equal((tp.tensor(np.ones((2, 3), np.float32)) + 2).numpy(), 3)  # op
        np.testing.assert_array_equal((tp.tensor(np.ones((2, 3), np.float32)) * 3).numpy(), 3)  # attr
        assert s.counters()["trace_misses"] == 5
        np.testing.assert_array_equal((tp.tensor(np.full((2, 3), 5, np.float32)) * 3).numpy(), 15)
        assert s.counters()["trace_hits"] == 2  # new values, same structure


def test_signature_sees_sharing_and_binds_inputs_by_position() -> None:
    a, b = tp.tensor(np.ones(3, np.float32)), tp.tensor(np.ones(3, np.float32))
    shared, _, _ = signature([a + a])
    distinct, _, ins = signature([a + b])
    assert shared != distinct and len(ins) == 2
    x, y = tp.tensor(np.ones(3, np.float32)), tp.tensor(np.zeros(3, np.float32))
    assert signature([x - y])[0] == signature([a - b])[0]
    s = EmbeddedSession()
    with use_session(s):
        np.testing.assert_array_equal((a - tp.tensor(np.zeros(3, np.float32))).numpy(), 1)
        np.testing.assert_array_equal((tp.tensor(np.zeros(3, np.float32)) - a).numpy(), -1)
    assert s.counters()["trace_hits"] == 1  # same structure: the bindings follow the walk


def test_signature_tells_attribute_values_apart() -> None:
    t = tp.tensor(np.ones(2, np.float32))
    a, b = t * 2, t * 3
    assert signature([a])[0] != signature([b])[0]


def test_a_kernel_error_in_a_replayed_step_names_the_users_line() -> None:
    s = EmbeddedSession()
    with use_session(s):
        logits = tp.tensor(np.zeros((2, 3), np.float32))
        nn.functional.cross_entropy(logits, tp.tensor(np.array([0, 1]))).numpy()
        with pytest.raises(KernelError) as e:
            nn.functional.cross_entropy(logits, tp.tensor(np.array([0, 7]))).numpy()
    assert s.counters()["trace_hits"] == 1
    assert "test_compile.py" in str(e.value)


def test_tp_compile_counts_its_compiled_steps() -> None:
    s = EmbeddedSession()
    w = tp.tensor(np.ones((3, 2), np.float32), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)

    @tp.compile
    def step(x: np.ndarray) -> float:
        loss = (tp.tensor(x) @ w).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    xs = [np.full((4, 3), 1.0, np.float32) for _ in range(4)]
    with use_session(s):
        got = [step(x) for x in xs]
    assert step.cache_info() == {"hits": 3, "misses": 1}
    # d loss / d w = x.T @ ones = 4 everywhere: w drops by 0.4 a step, loss by 4*3*2*0.4
    assert got == pytest.approx([24.0, 14.4, 4.8, -4.8])
    assert step.__name__ == "step" and "hits=3" in repr(step)
