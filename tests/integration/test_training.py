"""End to end: models' parameter gradients against finite differences, and training
that actually learns (loss falls, digits reach a sane accuracy in seconds)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import triplane as tp
from triplane.sdk import nn
from triplane.sdk.data import DataLoader, datasets
from triplane.sdk.nn import functional as F
from triplane.sdk.optim import SGD, Adam
from triplane.sdk.tensor import Tensor
from triplane.testing import check_grad


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def _mlp(x: Tensor, labels: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    return F.cross_entropy(tp.relu(x @ w1 + b1) @ w2 + b2, labels)


def _cnn(x: Tensor, labels: Tensor, k: Tensor, kb: Tensor, w: Tensor, b: Tensor) -> Tensor:
    h = F.max_pool2d(tp.relu(F.conv2d(x, k, kb, padding=1)), 2)
    return F.cross_entropy(h.reshape((x.shape[0], -1)) @ w + b, labels)


def test_mlp_parameter_gradients_match_finite_differences(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = Tensor.from_array(rng.standard_normal((4, 3)))
    labels = Tensor.from_array(rng.integers(0, 3, size=4))
    params = [rng.standard_normal(s) * 0.7 for s in ((3, 5), (5,), (5, 3), (3,))]
    try:
        check_grad(lambda *p: _mlp(x, labels, *p), params, rtol=1e-5, atol=1e-7)
    except AssertionError as e:
        raise AssertionError(f"seed={seed}: {e}") from None


def test_cnn_parameter_gradients_match_finite_differences(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = Tensor.from_array(rng.standard_normal((2, 1, 4, 4)))
    labels = Tensor.from_array(rng.integers(0, 3, size=2))
    params = [rng.standard_normal(s) * 0.5 for s in ((2, 1, 3, 3), (2,), (8, 3), (3,))]
    try:
        check_grad(lambda *p: _cnn(x, labels, *p), params, rtol=1e-5, atol=1e-7)
    except AssertionError as e:
        raise AssertionError(f"seed={seed}: {e}") from None


def _losses(model: nn.Module, opt: SGD | Adam, x: Tensor, y: Tensor, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
        out.append(loss.item())
    return out


def test_mlp_and_cnn_training_steps_reduce_the_loss(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tp.manual_seed(seed % 2**31)
    x = Tensor.from_array(rng.standard_normal((16, 1, 6, 6)).astype(np.float32))
    y = Tensor.from_array(rng.integers(0, 3, size=16))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(36, 3))
    losses = _losses(cnn, Adam(cnn.parameters(), lr=0.02), x, y, 10)
    assert losses[-1] < 0.7 * losses[0], f"seed={seed}: CNN losses {losses}"
    bn = cnn[1]
    assert isinstance(bn, nn.BatchNorm2d)
    assert not np.allclose(bn.running_mean.numpy(), 0), "running statistics never updated"

    mlp = nn.Sequential(nn.Flatten(), nn.Linear(36, 16), nn.Tanh(), nn.Linear(16, 3))
    losses = _losses(mlp, SGD(mlp.parameters(), lr=0.1, momentum=0.9), x, y, 10)
    assert losses[-1] < 0.7 * losses[0], f"seed={seed}: MLP losses {losses}"


def test_digits_training_reaches_a_sane_accuracy() -> None:
    t0 = time.perf_counter()
    tp.manual_seed(0)
    images, labels = datasets.digits(n=600, synthetic=True, seed=0)
    x = (images.reshape(len(images), -1) / 16.0).astype(np.float32)
    train, test = slice(0, 500), slice(500, None)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = Adam(model.parameters(), lr=0.01)
    for _ in range(15):
        for xb, yb in DataLoader(x[train], labels[train], batch_size=50, shuffle=True, seed=1):
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    pred = model(Tensor.from_array(x[test])).argmax(axis=1).numpy()
    accuracy = float((pred == labels[test]).mean())
    elapsed = time.perf_counter() - t0
    assert accuracy > 0.9, f"test accuracy {accuracy:.3f}"
    assert elapsed < 30, f"training took {elapsed:.1f}s"
