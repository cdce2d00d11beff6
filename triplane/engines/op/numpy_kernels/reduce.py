"""Kernels of the reductions."""

from __future__ import annotations

import numpy as np

from triplane.engines.op.numpy_engine import kernel


def axes_of(a):
    return None if a["axes"] is None else tuple(a["axes"])


@kernel("sum")
def _sum(ins, a, out):
    return np.sum(ins[0], axis=axes_of(a), keepdims=a["keepdims"], dtype=out.dtype.np)
