"""Penalties to add to a loss: ``loss + lam * l2_penalty(model.parameters())``.

Their gradients are what the optimisers' options add directly (cheaper, no extra graph
nodes in the forward pass): ``l1_penalty`` -> ``l1 * sign(p)`` (the optimisers' ``l1=``),
``l2_penalty`` (half the sum of squares) -> ``wd * p`` (``weight_decay=``, except AdamW's).
"""

from __future__ import annotations

from collections.abc import Iterable

from triplane.sdk.tensor import Tensor

__all__ = ["l1_penalty", "l2_penalty"]


def _total(terms: list[Tensor], what: str) -> Tensor:
    if not terms:
        raise ValueError(f"{what}: no parameters")
    out = terms[0]
    for t in terms[1:]:
        out = out + t.astype(out.dtype) if t.dtype != out.dtype else out + t
    return out


def l1_penalty(params: Iterable[Tensor]) -> Tensor:
    """sum over parameters of sum |p| (a lazy scalar)."""
    return _total([p.abs().sum() for p in params], "l1_penalty")


def l2_penalty(params: Iterable[Tensor]) -> Tensor:
    """sum over parameters of sum p**2 / 2 (a lazy scalar; its gradient is p)."""
    return _total([(p * p).sum() * 0.5 for p in params], "l2_penalty")
