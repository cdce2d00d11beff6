"""The engine contracts: small Protocols a vendor implements in one module each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from triplane.proto.ir import TensorType


@runtime_checkable
class OpEngine(Protocol):
    """Computes ops on arrays held by a memory engine of the same node.

    ``run`` returns one array of exactly ``out``'s shape and dtype, or raises
    :class:`triplane.proto.errors.KernelError` (a user error, not retried). Any other
    exception is treated as an infrastructure fault of the engine.
    """

    name: str
    device: str

    def supports(self, op: str, dtypes: Sequence[str]) -> bool: ...

    def run(self, op: str, inputs: Sequence[Any], attrs: Mapping[str, Any], out: TensorType) -> Any: ...

    def benchmark(self) -> Mapping[str, float]: ...


@runtime_checkable
class MemoryEngine(Protocol):
    """Holds tiles by id within a capacity in bytes."""

    name: str
    kind: str

    def put(self, key: str, value: np.ndarray) -> None: ...

    def get(self, key: str) -> np.ndarray: ...

    def delete(self, key: str) -> None: ...

    def capacity(self) -> int: ...

    def used(self) -> int: ...
