"""The graphs the cluster tests run both embedded and on clusters (a helper module, not tests)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import triplane as tp
from triplane.sdk import nn
from triplane.sdk.nn import functional as F

Build = Callable[[], list[tp.Tensor]]


def mlp_forward_backward() -> list[tp.Tensor]:
    tp.manual_seed(1)
    rng = np.random.default_rng(1)
    x = tp.Tensor.from_array(rng.standard_normal((32, 8)).astype(np.float32))
    y = tp.Tensor.from_array(rng.integers(0, 3, 32))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    loss = F.cross_entropy(model(x), y)
    return [loss, *tp.grad(loss, list(model.parameters()))]


def cnn_forward() -> list[tp.Tensor]:
    tp.manual_seed(2)
    rng = np.random.default_rng(2)
    x = tp.Tensor.from_array(rng.standard_normal((4, 1, 8, 8)).astype(np.float32))
    conv = nn.Conv2d(1, 4, 3, padding=1)
    h = F.max_pool2d(F.relu(conv(x)), 2)
    logits = nn.Linear(4 * 4 * 4, 5)(h.reshape(4, -1))
    return [F.log_softmax(logits, axis=-1), h]


def reductions_and_shapes() -> list[tp.Tensor]:
    a = tp.Tensor.from_array(np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7.0)
    b = tp.transpose(a, (2, 0, 1)).reshape(4, 6)
    return [tp.sum(a, axis=(0, 2)), tp.mean(b, axis=0), tp.max(a, axis=-1), tp.argmin(b, axis=1),
            tp.var(a), tp.logsumexp(b, axis=1), tp.concat([b, b * 2.0], axis=0)[1:5, ::2],
            tp.stack([a[0], a[1]], axis=0).sum(), tp.pad(b, ((1, 0), (0, 2))), tp.flip(b, axis=0)]


def random_ops() -> list[tp.Tensor]:
    tp.manual_seed(42)
    n = tp.randn(64, 16)
    u = tp.rand(16)
    return [n, u, (n * u).sum(axis=0), tp.normal((8,), mean=0.5, std=2.0)]


GRAPHS: dict[str, Build] = {"mlp_fwd_bwd": mlp_forward_backward, "cnn_fwd": cnn_forward,
                            "reduce_shape": reductions_and_shapes, "random": random_ops}
