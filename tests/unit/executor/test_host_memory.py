"""The host memory engine's capacity accounting."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.engines.memory.host import HostMemoryEngine, MemoryFullError, TileNotFoundError
from triplane.engines.protocols import MemoryEngine


def test_is_a_memory_engine_and_accounts_bytes() -> None:
    m = HostMemoryEngine(1000)
    assert isinstance(m, MemoryEngine)
    m.put("a", np.zeros(100, np.float32))  # 400 bytes
    m.put("b", np.zeros(50, np.int64))     # 400 bytes
    assert (m.used(), m.free(), m.capacity(), len(m)) == (800, 200, 1000, 2)
    m.delete("a")
    m.delete("a")  # idempotent
    assert m.used() == 400 and "a" not in m and "b" in m


def test_refuses_what_does_not_fit_and_changes_nothing() -> None:
    m = HostMemoryEngine(1000)
    m.put("a", np.zeros(200, np.float32))
    with pytest.raises(MemoryFullError, match=r"memory full: tile 'b' needs 400 bytes, 200 of 1000 free"):
        m.put("b", np.zeros(100, np.float32))
    assert m.used() == 800 and "b" not in m


def test_replacing_a_tile_counts_only_the_difference() -> None:
    m = HostMemoryEngine(1000)
    m.put("a", np.zeros(200, np.float32))
    m.put("a", np.zeros(250, np.float32))  # 1000 bytes: fits because the old 800 go
    assert m.used() == 1000
    m.put("a", np.zeros(10, np.float32))
    assert m.used() == 40


def test_stored_tiles_are_read_only_and_not_copied() -> None:
    m = HostMemoryEngine(1 << 20)
    x = np.arange(6, dtype=np.float32)
    m.put("x", x)
    got = m.get("x")
    assert np.shares_memory(got, x) and not got.flags.writeable
    with pytest.raises(ValueError):
        got[0] = 1
    with pytest.raises(TileNotFoundError, match="no such tile: y"):
        m.get("y")
    assert str(TileNotFoundError("no such tile: y")) == "no such tile: y"


def test_reservations_hold_capacity_until_put_or_release() -> None:
    m = HostMemoryEngine(1000)
    m.reserve(600)
    with pytest.raises(MemoryFullError):
        m.reserve(600)  # a concurrent upload cannot overshoot
    assert m.free() == 400
    m.put("a", np.zeros(150, np.float32), reserved=600)
    assert (m.used(), m.free()) == (600, 400)
    m.reserve(400)
    m.release(400)
    assert m.free() == 400
    m.reserve(1000, key="a")  # replacing "a": its 600 bytes count as available
    m.put("a", np.zeros(250, np.float32), reserved=1000)
    assert (m.used(), m.free()) == (1000, 0)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        HostMemoryEngine(0)
