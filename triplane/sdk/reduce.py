"""Reductions: ``tp.sum(x, axis=1, keepdims=True)`` and friends."""

from __future__ import annotations

from typing import Any

from triplane.sdk.tensor import Tensor, apply, as_tensor

__all__ = ["sum"]


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return apply("sum", [as_tensor(x)], axes=axis, keepdims=keepdims)
