"""numpy kernels, one module per op group (importing registers them)."""

from triplane.engines.op.numpy_kernels import (  # noqa: F401
    creation,
    elementwise,
    fused,
    linalg,
    nn,
    reduce,
    shape,
)
