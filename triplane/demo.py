"""The ``triplane demo`` program: a small MLP classifying scikit-learn's digits, in seconds.

The data: scikit-learn's 1,797 8x8 images of handwritten digits (64 features, pixel
values 0..16 scaled to [0, 1], 10 classes), split 80/20 by a seeded permutation. Without
scikit-learn (it is not a dependency of the base install) the demo says so and fits a
small synthetic regression instead (:func:`make_data`).

Each step is a compiled step (``tp.compile``): the first one or two compile, the rest
replay the compiled plan -- in-process, its kernel list; on a cluster, one small request
naming the scheduler's cached plan (docs/quickstart.md, "The faster path").

Kept apart from the CLI so it can be called (and tested) as a function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def make_data(seed: int, n: int = 128, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (n, d) and a smooth nonlinear target (n, 1), both float32, from ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w = rng.standard_normal((d, 1))
    y = np.sin(x @ w) + 0.5 * np.tanh(x[:, :1] * x[:, 1:2])
    return x.astype(np.float32), y.astype(np.float32)


@dataclass
class DemoData:
    """What the demo fits: train and test arrays and a sentence saying what they are."""

    kind: str  # "digits" (classification) or "synthetic" (regression)
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    description: str


def load_data(seed: int = 0) -> DemoData:
    """scikit-learn's digits (80/20 split by ``seed``), or :func:`make_data` without it."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        x, y = make_data(seed)
        return DemoData("synthetic", x, y, x[:0], y[:0],
                        f"synthetic regression (scikit-learn is not installed): {len(x)} samples, "
                        f"{x.shape[1]} features, target sin(x @ w) + 0.5 tanh(x0 x1)")
    images, labels = load_digits(return_X_y=True)
    x = (np.asarray(images) / 16.0).astype(np.float32)
    y = np.asarray(labels).astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.8 * len(x))
    tr, te = order[:n_train], order[n_train:]
    return DemoData("digits", x[tr], y[tr], x[te], y[te],
                    f"scikit-learn's digits: {len(x)} samples ({n_train} train, {len(x) - n_train} test), "
                    f"{x.shape[1]} features (8x8 pixels), {len(np.unique(y))} classes")


@dataclass
class DemoResult:
    losses: list[float] = field(default_factory=list)
    test_accuracy: float | None = None  # digits only
    cache_info: dict[str, int] = field(default_factory=dict)  # the compiled step's hits / misses


def run_demo(steps: int = 40, seed: int = 0, lr: float | None = None,
             on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """The loss before each step of :func:`fit` (full batch, compiled steps)."""
    return fit(load_data(seed), steps, seed, lr, on_step).losses


def fit(data: DemoData, steps: int = 40, seed: int = 0, lr: float | None = None,
        on_step: Callable[[int, float], None] | None = None) -> DemoResult:
    """Fit ``Linear(d, 32) -> tanh -> Linear(32, k)`` to ``data`` with SGD + momentum,
    full batch: cross-entropy on the digits (k = 10, default ``lr`` 0.5), mean squared
    error on the synthetic data (k = 1, default ``lr`` 0.1). Every step is a
    ``tp.compile``d step."""
    result = DemoResult()
    for value in _iter_fit(data, steps, seed, lr, result):
        result.losses.append(value)
        if on_step is not None:
            on_step(len(result.losses), value)
    return result


def _iter_fit(data: DemoData, steps: int, seed: int, lr: float | None, result: DemoResult) -> Iterator[float]:
    import triplane as tp
    from triplane.sdk import nn
    from triplane.sdk.nn import functional as F
    from triplane.sdk.optim import SGD

    tp.manual_seed(seed)
    digits = data.kind == "digits"
    k = 10 if digits else 1
    model = nn.Sequential(nn.Linear(data.x_train.shape[1], 32), nn.Tanh(), nn.Linear(32, k))
    opt = SGD(model.parameters(), lr=lr if lr is not None else 0.5 if digits else 0.1, momentum=0.9)
    loss_fn: Any = nn.CrossEntropyLoss() if digits else F.mse_loss
    tx, ty = tp.Tensor.from_array(data.x_train), tp.Tensor.from_array(data.y_train)

    @tp.compile
    def step() -> Any:
        loss = loss_fn(model(tx), ty)
        opt.zero_grad()
        loss.backward()
        opt.step()  # one graph run: the loss, the gradients and the updates
        return loss

    for _ in range(steps):
        yield float(step().item())
    result.cache_info = dict(step.cache_info())
    if digits:
        with tp.no_grad():
            pred = model(tp.Tensor.from_array(data.x_test)).argmax(axis=1).numpy()
        result.test_accuracy = float((pred == data.y_test).mean())
