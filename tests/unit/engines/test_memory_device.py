"""The device memory engine (cupy): the conformance kit and explicit copies. Skips without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.engines.memory.device import DeviceMemoryEngine, cupy_or_reason
from triplane.engines.memory.testing import MemoryEngineConformance

_cp, _why = cupy_or_reason()
pytestmark = pytest.mark.skipif(_cp is None, reason=f"no GPU for the device memory engine: {_why}")


class TestDeviceMemoryEngine(MemoryEngineConformance):
    @pytest.fixture
    def make_memory_engine(self):
        return lambda capacity: DeviceMemoryEngine(capacity)


def test_copies_are_explicit_and_counted():
    m = DeviceMemoryEngine(1 << 20)
    m.put("a", np.arange(10, dtype=np.float32))
    dev = m.get("a")
    assert isinstance(dev, _cp.ndarray) and m.copies["h2d"] == 1 and m.copies["d2h"] == 0
    with pytest.raises(TypeError):  # cupy refuses an implicit conversion
        np.asarray(dev)
    host = m.to_host(dev)
    np.testing.assert_array_equal(host, np.arange(10, dtype=np.float32))
    assert m.copies == {"h2d": 1, "h2d_bytes": 40, "d2h": 1, "d2h_bytes": 40}
