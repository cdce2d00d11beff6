"""Kernels of linear algebra."""

from __future__ import annotations

import numpy as np

from triplane.engines.op.numpy_engine import kernel


@kernel("matmul")
def _matmul(ins, a, out):
    return np.matmul(ins[0], ins[1])
