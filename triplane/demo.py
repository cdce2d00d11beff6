"""The ``triplane demo`` program: a tiny MLP fitted by gradient descent, in seconds.

Kept apart from the CLI so it can be called (and tested) as a function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np


def make_data(seed: int, n: int = 128, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (n, d) and a smooth nonlinear target (n, 1), both float32, from ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w = rng.standard_normal((d, 1))
    y = np.sin(x @ w) + 0.5 * np.tanh(x[:, :1] * x[:, 1:2])
    return x.astype(np.float32), y.astype(np.float32)


def run_demo(steps: int = 40, seed: int = 0, lr: float = 0.1,
             on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Fit ``Linear(4, 32) -> tanh -> Linear(32, 1)`` to :func:`make_data` with SGD +
    momentum on the mean squared error; returns the loss before each step."""
    return list(iter_demo(steps, seed, lr, on_step))


def iter_demo(steps: int, seed: int, lr: float,
              on_step: Callable[[int, float], None] | None = None) -> Iterator[float]:
    import triplane as tp
    from triplane.sdk import nn
    from triplane.sdk.nn import functional as F
    from triplane.sdk.optim import SGD

    tp.manual_seed(seed)
    x, y = make_data(seed)
    model = nn.Sequential(nn.Linear(x.shape[1], 32), nn.Tanh(), nn.Linear(32, 1))
    opt = SGD(model.parameters(), lr=lr, momentum=0.9)
    tx, ty = tp.Tensor.from_array(x), tp.Tensor.from_array(y)
    for step in range(1, steps + 1):
        loss = F.mse_loss(model(tx), ty)
        opt.zero_grad()
        loss.backward()
        opt.step(loss)  # the loss is computed in the step's graph run
        value = float(loss.item())
        if on_step is not None:
            on_step(step, value)
        yield value
