"""What a training step reuses from the steps before it: the autograd pass's nodes by
graph structure (``backward()``), inferred types by op, input types and attributes
(``apply``), and the optimiser's constants; none of it may change a value."""

from __future__ import annotations

import numpy as np
import pytest

import triplane as tp
from triplane import nn, optim
from triplane.proto.errors import GraphError
from triplane.sdk import autograd as sdk_autograd
from triplane.sdk.tensor import apply


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the autograd passes run from now on."""
    calls: list[int] = []
    real = sdk_autograd.autograd

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sdk_autograd, "autograd", counted)
    return calls


def _mlp_grads(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d sum(relu(x @ w1) @ w2) ** 2 / d (w1, w2), by hand in float64."""
    h = x @ w1
    a = np.maximum(h, 0)
    y = a @ w2
    gy = 2 * y
    return x.T @ ((gy @ w2.T) * (h > 0)), a.T @ gy


def test_a_second_backward_of_the_same_structure_replays_the_pass(seed: int, passes: list[int]) -> None:
    rng = np.random.default_rng(seed)
    w1 = tp.tensor(rng.standard_normal((5, 7)).astype(np.float32), requires_grad=True)
    w2 = tp.tensor(rng.standard_normal((7, 3)).astype(np.float32), requires_grad=True)
    for step in range(3):
        x = rng.standard_normal((4, 5)).astype(np.float32)
        w1.grad = w2.grad = None
        loss = ((tp.relu(tp.tensor(x) @ w1) @ w2) ** 2).sum()
        loss.backward()
        want1, want2 = _mlp_grads(*(np.asarray(v, np.float64) for v in (x, w1.numpy(), w2.numpy())))
        assert w1.grad is not None and w2.grad is not None
        np.testing.assert_allclose(w1.grad.numpy(), want1, rtol=1e-4, atol=1e-4, err_msg=f"seed={seed}")
        np.testing.assert_allclose(w2.grad.numpy(), want2, rtol=1e-4, atol=1e-4, err_msg=f"seed={seed}")
        assert len(passes) == 1, f"step {step}: the pass ran {len(passes)} times"
    # another shape is another structure: the pass runs again
    w2.grad = None
    ((tp.tensor(np.ones((2, 5), np.float32)) @ w1 @ w2) ** 2).sum().backward()
    assert len(passes) == 2


def test_replayed_gradients_are_lazy_tensors_that_differentiate_again(passes: list[int]) -> None:
    for v in (1.5, -2.0):
        x = tp.tensor(np.float32(v), requires_grad=True)
        y = x * x * x
        (g,) = tp.grad(y, [x])
        (gg,) = tp.grad(g, [x])  # 6x: the replayed gradient is a graph like any other
        assert g.item() == pytest.approx(3 * v * v) and gg.item() == pytest.approx(6 * v)
    assert len(passes) == 2  # one per structure (y, then g), each replayed the second time


def test_which_tensors_require_grad_is_part_of_the_structure(passes: list[int]) -> None:
    a = tp.tensor(np.float32(2.0), requires_grad=True)
    b = tp.tensor(np.float32(3.0))
    (a * b).backward()
    c = tp.tensor(np.float32(2.0))
    d = tp.tensor(np.float32(3.0), requires_grad=True)
    (c * d).backward()  # one leaf differentiated again, but the other one
    assert a.grad is not None and d.grad is not None
    assert (a.grad.item(), d.grad.item()) == (3.0, 2.0)
    assert b.grad is None and c.grad is None and len(passes) == 2


def test_inferred_types_are_memoised_by_attribute_type_and_bits() -> None:
    x = tp.tensor(np.ones((2, 3), np.float32))
    assert apply("sum", [x], axes=1).shape == (2,)
    with pytest.raises(GraphError, match="axes"):
        apply("sum", [x], axes=True)  # True == 1, but a bool is no axis: checked afresh
    with pytest.raises(GraphError, match="axes"):
        apply("sum", [x], axes=True)  # a failure is never memoised
    assert apply("sum", [x], axes=0).shape == (3,)
    assert apply("sum", [tp.tensor(np.ones((4, 3), np.float32))], axes=1).shape == (4,)
    f = apply("full", [], value=2, shape=(2,), dtype="int32")
    g = apply("full", [], value=2.0, shape=(2,), dtype="float32")
    assert type(f._attrs["value"]) is int and type(g._attrs["value"]) is float
    assert f.dtype.name == "int32" and g.dtype.name == "float32"
    np.testing.assert_array_equal(g.numpy(), [2.0, 2.0])


def test_a_training_loop_gives_the_values_of_fresh_recordings(seed: int) -> None:
    """The same loop twice: with every cache warm, and with the caches emptied before
    every step (each step then records, differentiates and compiles from scratch)."""
    from triplane.embedded import EmbeddedSession
    from triplane.sdk import inference as sdk_inference
    from triplane.sdk.optim import optimizers
    from triplane.sdk.session import use_session

    def train(fresh: bool) -> list[float]:
        rng = np.random.default_rng(seed)
        tp.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 4))
        opt = optim.Adam(model.parameters(), lr=1e-2)
        session = EmbeddedSession()
        losses = []
        for _ in range(4):
            if fresh:
                sdk_autograd._RULES.clear()
                sdk_inference._INFERRED.clear()
                optimizers._CONSTANTS.clear()
                session = EmbeddedSession()
            with use_session(session):
                x = rng.standard_normal((8, 6)).astype(np.float32)
                loss = nn.functional.cross_entropy(model(tp.tensor(x)), tp.tensor(rng.integers(0, 4, 8)))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses

    assert train(False) == train(True)


def test_adams_update_nodes_name_the_users_line_and_honour_no_grad() -> None:
    from triplane.sdk import autograd as ag

    p = tp.tensor(np.ones((3, 2), np.float32), requires_grad=True)
    opt = optim.Adam([p], lr=0.1)
    g = tp.tensor(np.full((3, 2), 0.5, np.float32))
    group = opt.param_groups[0]
    for _ in range(2):  # the second time the nodes are made from the recorded types
        new, state = opt._update(0, p, g, group, 1)
        assert new._where is not None and "test_step_caches.py" in new._where
        assert new.shape == (3, 2) and state["exp_avg"].dtype.name == "float32"
    with tp.no_grad():
        new, _ = opt._update(0, p, g, group, 1)
    assert ag._is_cut(new)  # recorded inside no_grad: cut like any other tensor
    # bias-corrected first step: p - lr * sign(g) (up to eps)
    np.testing.assert_allclose(new.numpy(), np.full((3, 2), 0.9, np.float32), rtol=1e-6)
