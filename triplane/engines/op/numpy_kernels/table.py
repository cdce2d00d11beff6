"""The numpy engine's kernel table, and how a kernel module declares its kernels.

A kernel is ``fn(inputs, attrs, out) -> ndarray``: ``inputs`` are numpy arrays, ``attrs``
the node's normalised attributes and ``out`` the inferred :class:`TensorType` of the
result. Each module of :mod:`triplane.engines.op.numpy_kernels` collects its kernels in a
:class:`KernelGroup`; the package's ``register_all`` puts them in :data:`KERNELS`. The
modules do not import the engine, and the engine imports them only through the package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from triplane.proto.ir import TensorType

__all__ = ["KERNELS", "PREPARERS", "Kernel", "KernelGroup", "Preparer"]

Kernel = Callable[[Sequence[np.ndarray], Mapping[str, Any], TensorType], np.ndarray]

# op name -> kernel: the built-ins (filled by numpy_kernels.register_all) and user ops'
# kernels (triplane.sdk.custom). The fused-program kernel looks its steps up here.
KERNELS: dict[str, Kernel] = {}

# A preparer ``prepare(attrs, input types, out)`` gives ``run(inputs)``, the op's kernel
# for inputs of those types with what does not depend on their values done once (the
# engine's ``bind``), or None (then the kernel runs as usual).
Preparer = Callable[[Mapping[str, Any], Sequence[TensorType], TensorType],
                    Callable[[Sequence[np.ndarray]], np.ndarray] | None]
PREPARERS: dict[str, Preparer] = {}


class KernelGroup:
    """The kernels one module declares, by op name."""

    def __init__(self) -> None:
        self.kernels: dict[str, Kernel] = {}
        self.preparers: dict[str, Preparer] = {}

    def kernel(self, *ops: str) -> Callable[[Kernel], Kernel]:
        """Declare the decorated function as the numpy kernel of ``ops``."""

        def deco(fn: Kernel) -> Kernel:
            for op in ops:
                self.kernels[op] = fn
            return fn

        return deco

    def preparer(self, *ops: str) -> Callable[[Preparer], Preparer]:
        """Declare the decorated function as the preparer of ``ops`` (see ``PREPARERS``)."""

        def deco(fn: Preparer) -> Preparer:
            for op in ops:
                self.preparers[op] = fn
            return fn

        return deco
