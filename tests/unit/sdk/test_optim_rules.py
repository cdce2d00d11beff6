"""Every optimiser's rule against a hand-written float64 numpy reference (always) and
against PyTorch's optimiser on the same inputs (where torch is importable), over several
steps with fresh random parameters and gradients each run (the seed is in the message)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from triplane.sdk import optim
from triplane.sdk.tensor import Tensor
from triplane.testing import assert_close

# float64 parameters against a float64 reference: only rounding-order differences remain.
RTOL, ATOL = 1e-10, 1e-12
# torch runs the same rule in a different order of operations.
TORCH_RTOL, TORCH_ATOL = 1e-9, 1e-11
STEPS = 5
SHAPES = ((3, 4), (4,))
# one parameter's step: (p, g, its state) -> new p
Rule = Callable[[np.ndarray, np.ndarray, dict[str, Any]], np.ndarray]


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def ref_sgd(lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
            nesterov: bool = False, l1: float = 0.0) -> Rule:
    def step(p: np.ndarray, g: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        g = g + l1 * np.sign(p) + weight_decay * p
        if momentum:
            st["buf"] = g.copy() if "buf" not in st else momentum * st["buf"] + (1 - dampening) * g
            g = g + momentum * st["buf"] if nesterov else st["buf"]
        return p - lr * g
    return step


def ref_adam(lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
             weight_decay: float = 0.0, amsgrad: bool = False, decoupled: bool = False,
             l1: float = 0.0) -> Rule:
    b1, b2 = betas

    def step(p: np.ndarray, g: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        t = st["t"] = st.get("t", 0) + 1
        g = g + l1 * np.sign(p)
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        st["m"] = b1 * st.get("m", 0.0) + (1 - b1) * g
        st["v"] = b2 * st.get("v", 0.0) + (1 - b2) * g * g
        v = st["v"]
        if amsgrad:
            v = st["vmax"] = np.maximum(st.get("vmax", 0.0), v)
        mhat, vhat = st["m"] / (1 - b1**t), v / (1 - b2**t)
        return p - lr * mhat / (np.sqrt(vhat) + eps)
    return step


def ref_rmsprop(lr: float, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
                momentum: float = 0.0, centered: bool = False,
                l1: float = 0.0) -> Rule:
    def step(p: np.ndarray, g: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        g = g + l1 * np.sign(p) + weight_decay * p
        st["sq"] = alpha * st.get("sq", 0.0) + (1 - alpha) * g * g
        if centered:
            st["ga"] = alpha * st.get("ga", 0.0) + (1 - alpha) * g
            avg = np.sqrt(st["sq"] - st["ga"] ** 2) + eps
        else:
            avg = np.sqrt(st["sq"]) + eps
        if momentum:
            st["buf"] = momentum * st.get("buf", 0.0) + g / avg
            return p - lr * st["buf"]
        return p - lr * g / avg
    return step


# (triplane class, torch class name, kwargs, reference)
CASES: list[tuple[str, str, dict[str, Any], Callable[..., Any]]] = [
    ("SGD", "SGD", {"lr": 0.1}, ref_sgd),
    ("SGD", "SGD", {"lr": 0.1, "momentum": 0.9}, ref_sgd),
    ("SGD", "SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.01}, ref_sgd),
    ("SGD", "SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.02}, ref_sgd),
    ("Adam", "Adam", {"lr": 0.01, "betas": (0.9, 0.99)}, ref_adam),
    ("Adam", "Adam", {"lr": 0.01, "weight_decay": 0.05}, ref_adam),
    ("Adam", "Adam", {"lr": 0.02, "betas": (0.8, 0.9), "amsgrad": True}, ref_adam),
    ("AdamW", "AdamW", {"lr": 0.01, "weight_decay": 0.1}, ref_adam),
    ("AdamW", "AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}, ref_adam),
    ("RMSprop", "RMSprop", {"lr": 0.01}, ref_rmsprop),
    ("RMSprop", "RMSprop", {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.01}, ref_rmsprop),
    ("RMSprop", "RMSprop", {"lr": 0.005, "alpha": 0.9, "centered": True, "momentum": 0.5}, ref_rmsprop),
]
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for name, _, kw, _ in CASES]


def _draw(rng: np.random.Generator) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    init = [rng.uniform(-1, 1, size=s) for s in SHAPES]
    grads = [[rng.uniform(-1, 1, size=s) for s in SHAPES] for _ in range(STEPS)]
    return init, grads


def _run_triplane(name: str, kw: dict[str, Any], init: list[np.ndarray],
                  grads: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    ps = [Tensor.from_array(p, requires_grad=True) for p in init]
    opt = getattr(optim, name)(ps, **kw)
    out = []
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = Tensor.from_array(g)
        opt.step()
        out.append([np.array(p.numpy()) for p in ps])
    return out


@pytest.mark.parametrize("name,torch_name,kw,ref", CASES, ids=IDS)
def test_matches_numpy_reference(seed: int, name: str, torch_name: str, kw: dict[str, Any],
                                 ref: Callable[..., Any]) -> None:
    init, grads = _draw(np.random.default_rng(seed))
    rule = ref(**kw, decoupled=True) if name == "AdamW" else ref(**kw)
    want, states = [p.copy() for p in init], [{} for _ in init]
    for step, (gs, got) in enumerate(zip(grads, _run_triplane(name, kw, init, grads))):
        want = [rule(p, g, st) for p, g, st in zip(want, gs, states)]
        for i in range(len(init)):
            assert_close(got[i], want[i], rtol=RTOL, atol=ATOL, what=f"seed={seed} step={step} param={i}")


@pytest.mark.parametrize("name,torch_name,kw,ref", CASES, ids=IDS)
def test_matches_torch(seed: int, name: str, torch_name: str, kw: dict[str, Any],
                       ref: Callable[..., Any]) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the numpy reference runs)")
    init, grads = _draw(np.random.default_rng(seed))
    tps = [torch.tensor(p, requires_grad=True) for p in init]
    topt = getattr(torch.optim, torch_name)(tps, **kw)
    for step, (gs, got) in enumerate(zip(grads, _run_triplane(name, kw, init, grads))):
        for p, g in zip(tps, gs):
            p.grad = torch.tensor(g)
        topt.step()
        for i, p in enumerate(tps):
            assert_close(got[i], p.detach().numpy(), rtol=TORCH_RTOL, atol=TORCH_ATOL,
                         what=f"seed={seed} step={step} param={i}")


@pytest.mark.parametrize("name", ["SGD", "Adam", "RMSprop"])
def test_l1_option_is_the_gradient_of_an_l1_penalty(seed: int, name: str) -> None:
    # l1=lam adds lam * sign(p) to the gradient: the same steps as adding lam * l1_penalty
    # to the loss and differentiating.
    rng = np.random.default_rng(seed)
    init = [rng.uniform(-1, 1, size=s) for s in SHAPES]
    x = Tensor.from_array(rng.standard_normal((5, 3)))
    lam, lr = 0.03, 0.01

    def run(with_option: bool) -> list[np.ndarray]:
        ps = [Tensor.from_array(p, requires_grad=True) for p in init]
        opt = getattr(optim, name)(ps, lr=lr, l1=lam if with_option else 0.0)
        for _ in range(3):
            loss = ((x @ ps[0] + ps[1]) ** 2).mean()
            if not with_option:
                loss = loss + lam * optim.l1_penalty(ps)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [np.array(p.numpy()) for p in ps]

    for i, (a, b) in enumerate(zip(run(True), run(False))):
        assert_close(a, b, rtol=1e-10, atol=1e-12, what=f"seed={seed} param={i}")


def test_weight_decay_is_the_gradient_of_an_l2_penalty(seed: int) -> None:
    rng = np.random.default_rng(seed)
    init = rng.uniform(-1, 1, size=(4,))
    x = Tensor.from_array(rng.standard_normal((6, 4)))

    def run(wd: float, penalty: float) -> np.ndarray:
        p = Tensor.from_array(init, requires_grad=True)
        opt = optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=wd)
        for _ in range(3):
            loss = ((x @ p) ** 2).mean() + penalty * optim.l2_penalty([p])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return np.array(p.numpy())

    assert_close(run(0.05, 0.0), run(0.0, 0.05), rtol=1e-10, atol=1e-12, what=f"seed={seed}")


def test_parameter_groups_take_their_own_options() -> None:
    a = Tensor.from_array(np.ones(2), requires_grad=True)
    b = Tensor.from_array(np.ones(2), requires_grad=True)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    a.grad = b.grad = Tensor.from_array(np.ones(2))
    opt.step()
    assert_close(a.numpy(), np.full(2, 0.9))
    assert_close(b.numpy(), np.full(2, 0.5))
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['betas'\]"):
        optim.SGD([{"params": [a], "betas": (0.9, 0.9)}])
    with pytest.raises(ValueError, match="appears twice"):
        optim.SGD([a, a])
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([a], lr=0.1, nesterov=True)


def test_step_without_arguments_reads_the_loss_of_this_step() -> None:
    # PyTorch's habit: backward, step, then read the loss. The step computes the output
    # backward() ran on before it changes the parameters.
    p = Tensor.from_array(np.array([1.0, 2.0]), requires_grad=True)
    opt = optim.SGD([p], lr=0.25)
    for want in (5.0, 1.25):
        loss = (p * p).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert loss.item() == pytest.approx(want)


@pytest.mark.parametrize("name,kw", [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 0.01}),
                                     ("AdamW", {"lr": 0.01, "amsgrad": True}),
                                     ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5})])
def test_state_dict_resumes_exactly(seed: int, name: str, kw: dict[str, Any]) -> None:
    init, grads = _draw(np.random.default_rng(seed))
    straight = _run_triplane(name, kw, init, grads)[-1]
    ps = [Tensor.from_array(p, requires_grad=True) for p in init]
    opt = getattr(optim, name)(ps, **kw)
    for gs in grads[:2]:
        for p, g in zip(ps, gs):
            p.grad = Tensor.from_array(g)
        opt.step()
    saved = opt.state_dict()
    assert sorted(saved) == ["param_groups", "state"] and saved["state"][0]["step"] == 2
    assert all(isinstance(v, (np.ndarray, int)) for st in saved["state"].values() for v in st.values())
    qs = [Tensor.from_array(np.array(p.numpy()), requires_grad=True) for p in ps]
    opt2 = getattr(optim, name)(qs, lr=123.0)  # options come back from the state dict
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["lr"] == kw["lr"]
    for gs in grads[2:]:
        for q, g in zip(qs, gs):
            q.grad = Tensor.from_array(g)
        opt2.step()
    for i, q in enumerate(qs):
        assert_close(q.numpy(), straight[i], rtol=RTOL, atol=ATOL, what=f"seed={seed} param={i}")


def test_load_state_dict_refuses_a_mismatch() -> None:
    a = Tensor.from_array(np.ones(2), requires_grad=True)
    opt = optim.Adam([a])
    a.grad = Tensor.from_array(np.ones(2))
    opt.step()
    other = optim.Adam([Tensor.from_array(np.ones(3), requires_grad=True)])
    with pytest.raises(ValueError, match=r"'exp_avg' of parameter 0 has shape \[2\].*\[3\]"):
        other.load_state_dict(opt.state_dict())
    two = optim.Adam([Tensor.from_array(np.ones(2), requires_grad=True)] * 1
                     + [Tensor.from_array(np.ones(2), requires_grad=True)])
    with pytest.raises(ValueError, match=r"sizes \[1\].*\[2\]"):
        two.load_state_dict(opt.state_dict())


def test_zero_grad_to_zeros_still_steps() -> None:
    # PyTorch's zero_grad(set_to_none=False): a zero gradient is a gradient, so momentum
    # (and weight decay) still move the parameter.
    p = Tensor.from_array(np.array([1.0]), requires_grad=True)
    opt = optim.SGD([p], lr=0.1, momentum=0.5)
    p.grad = Tensor.from_array(np.array([1.0]))
    opt.step()  # buf = 1, p = 0.9
    opt.zero_grad(set_to_none=False)
    opt.step()  # buf = 0.5, p = 0.85
    assert p.numpy()[0] == pytest.approx(0.85)
    opt.zero_grad()
    assert p.grad is None
