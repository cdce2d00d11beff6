"""Shape functions: reshape, transpose, broadcast_to, indexing..."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from triplane.proto.errors import ShapeError
from triplane.sdk.tensor import Tensor, apply, as_tensor

__all__ = ["broadcast_to", "reshape", "transpose"]


def reshape(x: Any, shape: Sequence[int] | int) -> Tensor:
    """numpy.reshape; one dimension may be -1 (inferred)."""
    x = as_tensor(x)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: only one dimension can be -1, got {list(shape)}")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or x.size % rest:
            raise ShapeError(f"reshape: cannot reshape {x.shape} to {list(shape)}")
        shape = tuple(x.size // rest if s == -1 else s for s in shape)
    if shape == x.shape:
        return x
    return apply("reshape", [x], shape=shape)


def transpose(x: Any, axes: Sequence[int] | None = None) -> Tensor:
    """numpy.transpose: reverse the axes, or permute them as ``axes`` says."""
    x = as_tensor(x)
    perm = tuple(range(x.ndim))[::-1] if axes is None else tuple(a % max(x.ndim, 1) for a in axes)
    return apply("transpose", [x], perm=perm)


def broadcast_to(x: Any, shape: Sequence[int]) -> Tensor:
    x = as_tensor(x)
    return x if tuple(shape) == x.shape else apply("broadcast_to", [x], shape=tuple(shape))
