"""Loss modules, PyTorch's: ``nn.CrossEntropyLoss()(logits, labels)``. Each holds its
options and calls the function of the same name in ``nn.functional``."""

from __future__ import annotations

from typing import Any

from triplane.sdk.nn import functional as F
from triplane.sdk.nn.modules import Module
from triplane.sdk.tensor import Tensor

__all__ = ["CrossEntropyLoss", "MSELoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(cls: str, reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{cls}: reduction must be one of {list(_REDUCTIONS)}, got {reduction!r}")
    return reduction


class CrossEntropyLoss(Module):
    """Softmax cross entropy of logits (N, C) (or (C,), or (N, C, d...)) against integer
    class labels. ``reduction``: "mean" (over labels that are not ``ignore_index``), "sum"
    or "none"; ``label_smoothing`` in [0, 1] mixes the one-hot target with the uniform
    distribution, as PyTorch does."""

    def __init__(self, reduction: str = "mean", ignore_index: int | None = None,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.reduction = _check_reduction("CrossEntropyLoss", reduction)
        self.ignore_index, self.label_smoothing = ignore_index, float(label_smoothing)

    def forward(self, logits: Any, labels: Any) -> Tensor:
        return F.cross_entropy(logits, labels, reduction=self.reduction, ignore_index=self.ignore_index,
                               label_smoothing=self.label_smoothing)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, label_smoothing={self.label_smoothing}"


class MSELoss(Module):
    """Mean (or "sum", or "none": elementwise) squared error; operands broadcast."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _check_reduction("MSELoss", reduction)

    def forward(self, x: Any, y: Any) -> Tensor:
        return F.mse_loss(x, y, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
