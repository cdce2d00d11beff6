"""LR schedulers against closed forms written here in numpy (always) and against
PyTorch's schedulers over the same steps (where torch is importable)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from triplane.sdk import optim
from triplane.sdk.optim import lr_scheduler
from triplane.sdk.tensor import Tensor

EPOCHS = 25
RTOL = 1e-12  # both are closed forms in float64
TORCH_RTOL = 1e-9  # torch's cosine is a recurrence: rounding accumulates a little


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


Build = Callable[[Any, Any], Any]
Ref = Callable[[float, int], float]


def _schedules(rng: np.random.Generator) -> list[tuple[str, Build, Ref]]:
    """(id, build(module, optimizer) -> scheduler, reference(base, epoch) -> lr)."""
    step_size, gamma = int(rng.integers(1, 6)), float(rng.uniform(0.1, 0.9))
    t_max, eta_min = int(rng.integers(3, 12)), float(rng.uniform(0, 1e-3))
    s0, total = float(rng.uniform(0.01, 0.5)), int(rng.integers(2, 8))

    def cos(base: float, e: int) -> float:
        return eta_min + (base - eta_min) * (1 + np.cos(np.pi * e / t_max)) / 2

    def warm(base: float, e: int) -> float:
        return base * (s0 + (1 - s0) * min(e, total) / total)

    return [
        ("StepLR", lambda m, o: m.StepLR(o, step_size=step_size, gamma=gamma),
         lambda b, e: b * gamma ** (e // step_size)),
        ("CosineAnnealingLR", lambda m, o: m.CosineAnnealingLR(o, T_max=t_max, eta_min=eta_min), cos),
        ("LinearLR", lambda m, o: m.LinearLR(o, start_factor=s0, total_iters=total), warm),
        ("LambdaLR", lambda m, o: m.LambdaLR(o, lambda e: 0.95**e), lambda b, e: b * 0.95**e),
        ("SequentialLR", lambda m, o: m.SequentialLR(
            o, [m.LinearLR(o, start_factor=s0, total_iters=total), m.CosineAnnealingLR(o, T_max=t_max)],
            milestones=[total]),
         lambda b, e: warm(b, e) if e < total else (1 + np.cos(np.pi * (e - total) / t_max)) * b / 2),
    ]


NAMES = ["StepLR", "CosineAnnealingLR", "LinearLR", "LambdaLR", "SequentialLR"]


def _pick(rng: np.random.Generator, name: str) -> tuple[Build, Ref]:
    return next((b, r) for n, b, r in _schedules(rng) if n == name)


def _lrs(sched: Any, opt: Any) -> list[list[float]]:
    """The rates of epochs 0..EPOCHS-1: what get_last_lr() reports and what the groups hold."""
    out = []
    for _ in range(EPOCHS):
        assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
        out.append(sched.get_last_lr())
        sched.step()
    return out


@pytest.mark.parametrize("name", NAMES)
def test_matches_closed_form(seed: int, name: str) -> None:
    build, ref = _pick(np.random.default_rng(seed), name)
    p = Tensor.from_array(np.ones(2), requires_grad=True)
    q = Tensor.from_array(np.ones(2), requires_grad=True)
    opt = optim.SGD([{"params": [p]}, {"params": [q], "lr": 0.3}], lr=0.1)
    got = _lrs(build(lr_scheduler, opt), opt)
    for e, lrs in enumerate(got):
        for base, lr in zip((0.1, 0.3), lrs):
            assert lr == pytest.approx(ref(base, e), rel=RTOL, abs=1e-15), f"seed={seed} epoch={e}"


@pytest.mark.parametrize("name", NAMES)
def test_matches_torch(seed: int, name: str) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the closed-form test runs)")
    build, _ = _pick(np.random.default_rng(seed), name)
    opt = optim.SGD([Tensor.from_array(np.ones(2), requires_grad=True)], lr=0.1)
    topt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    ours, theirs = _lrs(build(lr_scheduler, opt), opt), _lrs(build(torch.optim.lr_scheduler, topt), topt)
    np.testing.assert_allclose(ours, theirs, rtol=TORCH_RTOL, atol=1e-15, err_msg=f"seed={seed}")


def test_the_step_uses_the_scheduled_rate_without_recompiling() -> None:
    from triplane.sdk import session as session_mod

    p = Tensor.from_array(np.zeros(1), requires_grad=True)
    opt = optim.SGD([p], lr=1.0)
    sched = optim.StepLR(opt, step_size=1, gamma=0.5)
    sess = session_mod.current_session()
    hits = []
    for _ in range(4):
        p.grad = Tensor.from_array(np.ones(1))
        before = sess.traces.hits
        opt.step()
        hits.append(sess.traces.hits - before)
        sched.step()
    assert p.numpy()[0] == pytest.approx(-(1 + 0.5 + 0.25 + 0.125))
    assert hits[1:] == [1, 1, 1]


def test_state_dict_resumes(seed: int) -> None:
    build, _ = _pick(np.random.default_rng(seed), "CosineAnnealingLR")
    opt = optim.Adam([Tensor.from_array(np.ones(2), requires_grad=True)], lr=0.01)
    sched = build(lr_scheduler, opt)
    for _ in range(7):
        sched.step()
    saved, opt_saved = sched.state_dict(), opt.state_dict()
    assert saved["last_epoch"] == 7 and "optimizer" not in saved
    want = [sched.get_last_lr()] + [(sched.step(), sched.get_last_lr())[1] for _ in range(5)]
    opt2 = optim.Adam([Tensor.from_array(np.ones(2), requires_grad=True)], lr=0.01)
    opt2.load_state_dict(opt_saved)
    sched2 = optim.CosineAnnealingLR(opt2, T_max=1000)  # T_max comes back from the state
    sched2.load_state_dict(saved)
    assert opt2.param_groups[0]["lr"] == want[0][0]
    got = [sched2.get_last_lr()] + [(sched2.step(), sched2.get_last_lr())[1] for _ in range(5)]
    np.testing.assert_allclose(got, want, rtol=RTOL, err_msg=f"seed={seed}")


def test_bad_arguments() -> None:
    opt = optim.SGD([Tensor.from_array(np.ones(2), requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="step_size"):
        optim.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="milestones"):
        optim.SequentialLR(opt, [optim.StepLR(opt, 2)], milestones=[3])
    with pytest.raises(TypeError, match="needs an Optimizer"):
        optim.StepLR(object(), 2)  # type: ignore[arg-type]
    assert math.isclose(optim.LinearLR(opt, 0.5, total_iters=2).get_last_lr()[0], 0.05)
