"""Kernels of linear algebra."""

from __future__ import annotations

import numpy as np

from triplane.engines.op.numpy_kernels.table import KernelGroup

KERNEL_GROUP = KernelGroup()  # registered by numpy_kernels.register_all
kernel = KERNEL_GROUP.kernel


@kernel("matmul")
def _matmul(ins, a, out):
    x, y = ins
    if x.dtype == np.float16:
        # numpy's float16 matmul has no BLAS path; accumulate in float32 and round once,
        # as half-precision hardware does.
        return np.matmul(x.astype(np.float32), y.astype(np.float32))
    return np.matmul(x, y)
