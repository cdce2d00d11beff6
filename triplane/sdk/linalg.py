"""Linear algebra: ``tp.matmul`` (also ``x @ w``)."""

from __future__ import annotations

from typing import Any

from triplane.sdk.elementwise import operands
from triplane.sdk.tensor import Tensor, apply

__all__ = ["matmul"]


def matmul(x: Any, y: Any) -> Tensor:
    """numpy.matmul: 1-d operands are vectors; batch dimensions broadcast."""
    return apply("matmul", operands(x, y))
