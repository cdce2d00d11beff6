"""The device memory engine: tiles in GPU memory through cupy.

``DeviceMemoryEngine(capacity, device=0)`` keeps each tile as a cupy array on GPU
``device``, within ``capacity`` bytes. Moves between the host and the device are
explicit copies made by this engine, never implicit conversions: ``put`` of a numpy
array copies it to the device (``to_device``), ``get`` returns the device array (what
the cupy op engine computes on), and ``to_host(array)`` copies one back (the data port
calls it before sending a tile). The counters ``copies`` (``h2d``, ``h2d_bytes``,
``d2h``, ``d2h_bytes``) say how many copies were made. A device array is not
write-protected (cupy has no read-only flag): nothing writes a stored tile, by contract.

Needs cupy and a GPU: without them, making one raises ``RuntimeError`` naming what is
missing (the tests skip with that reason).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triplane.engines.memory.blob import BlobMemoryEngine

__all__ = ["DeviceMemoryEngine", "cupy_or_reason"]


def cupy_or_reason() -> tuple[Any, str]:
    """(the cupy module, "") if cupy and a GPU are usable, else (None, why not)."""
    try:
        import cupy
    except ImportError as e:
        return None, f"cupy is not installed ({e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "cupy finds no GPU"
    except Exception as e:
        return None, f"cupy finds no usable GPU ({e})"
    return cupy, ""


class DeviceMemoryEngine(BlobMemoryEngine):
    """Tiles as cupy arrays on one GPU, bounded by ``capacity`` bytes."""

    kind = "device"

    def __init__(self, capacity: int, device: int = 0, name: str = "device") -> None:
        cp, why = cupy_or_reason()
        if cp is None:
            raise RuntimeError(f"the device memory engine needs a GPU: {why}")
        super().__init__(capacity, name)
        self.cp = cp
        self.device = int(device)
        self.copies = {"h2d": 0, "h2d_bytes": 0, "d2h": 0, "d2h_bytes": 0}

    def to_device(self, value: Any) -> Any:
        """A device copy of a host array (a device array is returned as it is)."""
        if isinstance(value, self.cp.ndarray):
            return value
        host = np.asarray(value)
        with self.cp.cuda.Device(self.device):
            arr = self.cp.asarray(host)
        self.copies["h2d"] += 1
        self.copies["h2d_bytes"] += host.nbytes
        return arr

    def to_host(self, value: Any) -> np.ndarray:
        """A read-only host copy of a device array (a host array is returned as it is)."""
        if not isinstance(value, self.cp.ndarray):
            return np.asarray(value)
        out = self.cp.asnumpy(value)
        out.flags.writeable = False
        self.copies["d2h"] += 1
        self.copies["d2h_bytes"] += out.nbytes
        return out

    def _prepare(self, value: Any) -> Any:
        return self.to_device(value)
