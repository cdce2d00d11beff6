"""nn.CrossEntropyLoss / nn.MSELoss: values and gradients against float64 numpy
references written here (and PyTorch where importable), for every reduction."""

from __future__ import annotations

import numpy as np
import pytest

import triplane as tp
from triplane.sdk import nn
from triplane.testing import assert_close

RTOL, ATOL = 1e-10, 1e-12


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def ref_cross_entropy(logits: np.ndarray, labels: np.ndarray, reduction: str, smoothing: float) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    c = logits.shape[1]
    target = (1 - smoothing) * np.eye(c)[labels] + smoothing / c
    per = -(target * logp).sum(axis=1)
    return {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_loss(seed: int, reduction: str, smoothing: float) -> None:
    rng = np.random.default_rng(seed)
    logits, labels = rng.standard_normal((7, 5)) * 3, rng.integers(0, 5, size=7)
    x = tp.tensor(logits, requires_grad=True)
    loss = nn.CrossEntropyLoss(reduction=reduction, label_smoothing=smoothing)(x, tp.tensor(labels))
    want = ref_cross_entropy(logits, labels, reduction, smoothing)
    assert_close(loss.numpy(), want, rtol=RTOL, atol=ATOL, what=f"seed={seed}")
    (g,) = tp.grad(loss.sum(), [x])
    eps = 1e-6
    num = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape):
        d = np.zeros_like(logits)
        d[idx] = eps
        num[idx] = (ref_cross_entropy(logits + d, labels, reduction, smoothing).sum()
                    - ref_cross_entropy(logits - d, labels, reduction, smoothing).sum()) / (2 * eps)
    assert_close(g.numpy(), num, rtol=1e-6, atol=1e-8, what=f"seed={seed} gradient")
    torch = _torch()
    if torch is not None:
        t = torch.nn.CrossEntropyLoss(reduction=reduction, label_smoothing=smoothing)(
            torch.tensor(logits), torch.tensor(labels))
        assert_close(loss.numpy(), t.numpy(), rtol=1e-9, atol=1e-12, what=f"seed={seed} torch")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(seed: int, reduction: str) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    loss = nn.MSELoss(reduction)(tp.tensor(a), tp.tensor(b))
    sq = (a - b) ** 2
    assert_close(loss.numpy(), {"mean": sq.mean(), "sum": sq.sum(), "none": sq}[reduction],
                 rtol=RTOL, atol=ATOL, what=f"seed={seed}")
    torch = _torch()
    if torch is not None:
        t = torch.nn.MSELoss(reduction=reduction)(torch.tensor(a), torch.tensor(b))
        assert_close(loss.numpy(), t.numpy(), rtol=1e-9, atol=1e-12, what=f"seed={seed} torch")


def test_bad_options() -> None:
    with pytest.raises(ValueError, match=r"reduction must be one of \['mean', 'sum', 'none'\], got 'avg'"):
        nn.MSELoss("avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        nn.CrossEntropyLoss(label_smoothing=1.5)
    assert "label_smoothing=0.1" in repr(nn.CrossEntropyLoss(label_smoothing=0.1))


def _torch():  # type: ignore[no-untyped-def]
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None
    return torch
