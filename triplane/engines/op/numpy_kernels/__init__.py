"""numpy kernels, one module per op group. The modules declare their kernels and register
nothing; importing this package puts them all in the kernel table (:func:`register_all`,
``table.KERNELS``).
"""

from triplane.engines.op.numpy_kernels import creation, elementwise, fused, linalg, nn, reduce, shape
from triplane.engines.op.numpy_kernels.table import KERNELS, PREPARERS, Kernel, KernelGroup

__all__ = ["GROUPS", "KERNELS", "PREPARERS", "Kernel", "register_all"]

GROUPS: tuple[KernelGroup, ...] = tuple(
    m.KERNEL_GROUP for m in (creation, elementwise, fused, linalg, nn, reduce, shape))


def register_all() -> None:
    """Put every built-in kernel in the table. Idempotent."""
    for group in GROUPS:
        KERNELS.update(group.kernels)
        PREPARERS.update(group.preparers)


register_all()
