"""Linear algebra: ``tp.matmul`` (also ``x @ w``)."""

from __future__ import annotations

from typing import Any

from triplane.proto import dtypes as dt
from triplane.sdk.elementwise import coerce, ne, operands, result_dtype
from triplane.sdk.tensor import Tensor, apply

__all__ = ["matmul"]


def matmul(x: Any, y: Any) -> Tensor:
    """numpy.matmul: 1-d operands are vectors; batch dimensions broadcast; dtypes promote
    as for arithmetic. Of two bools: bool, true where some pair of terms is (numpy's)."""
    x, y = coerce(x, y)
    if result_dtype(x, y) == dt.bool_:
        return ne(apply("matmul", operands(x, y, dtype=dt.int64)), 0)
    return apply("matmul", operands(x, y))
