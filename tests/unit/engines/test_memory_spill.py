"""Spill: at capacity, least recently used tiles go to the file tier and come back on demand."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from triplane.engines.errors import MemoryFullError
from triplane.engines.memory.spill import SpillingMemoryEngine
from triplane.engines.memory.testing import MemoryEngineConformance
from triplane.engines.registry import get_memory_engine


class TestSpillingMemoryEngine(MemoryEngineConformance):
    @pytest.fixture
    def make_memory_engine(self, tmp_path):
        return lambda capacity: SpillingMemoryEngine(capacity, path=str(tmp_path / "spill"))


def _tile(i: int) -> np.ndarray:
    return np.full(100, float(i))  # 800 bytes


def test_at_capacity_the_least_recently_used_tiles_spill_and_read_back(tmp_path):
    m = SpillingMemoryEngine(8000, memory=2400, path=str(tmp_path))  # 3 tiles in memory, 10 in all
    for i in range(9):
        m.put(f"t{i}", _tile(i))
        if i >= 1:
            m.get("t0")  # t0 stays hot
    r = m.spill_report()
    assert r["memory_used"] == 2400 and r["file_used"] == 9 * 800 - 2400 and m.used() == 9 * 800
    assert r["spills"] == 6 and r["spilled_bytes"] == 6 * 800 and r["reads"] == 0
    fast = m.primary.keys()
    assert "t0" in fast and "t1" not in fast  # LRU, not FIFO
    np.testing.assert_array_equal(m.get("t1"), _tile(1))  # read back from the file tier
    r = m.spill_report()
    assert r["reads"] == 1 and r["spills"] == 7 and m.primary.keys().count("t1") == 1
    assert m.free() == 8000 - 9 * 800
    with pytest.raises(MemoryFullError, match="spill directory"):
        m.put("big", np.zeros(2000 // 8 + 1))  # the whole capacity is the limit, not the memory
    for i in range(9):
        np.testing.assert_array_equal(m.get(f"t{i}"), _tile(i))
    m.delete("t3")
    m.delete("t4")
    assert m.used() == 7 * 800 and m.primary.used() + m.file.used() == 7 * 800


def test_a_tile_larger_than_the_memory_goes_straight_to_the_file_tier(tmp_path):
    m = SpillingMemoryEngine(8000, memory=1000, path=str(tmp_path))
    m.put("small", _tile(1))
    m.put("big", np.ones(500))  # 4000 bytes
    assert m.file.keys() == ["big"] and m.primary.keys() == ["small"]
    np.testing.assert_array_equal(m.get("big"), np.ones(500))
    assert m.file.keys() == ["big"]  # too big to come back: read from the file each time


def test_concurrent_writers_beyond_memory_all_read_back(tmp_path):
    m = SpillingMemoryEngine(64 * 800, memory=4 * 800, path=str(tmp_path))
    errors = []

    def worker(w: int) -> None:
        try:
            for i in range(6):
                m.put(f"w{w}.{i}", _tile(w * 10 + i))
            for i in range(6):
                assert float(m.get(f"w{w}.{i}")[0]) == w * 10 + i
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and m.used() == 36 * 800 and m.primary.used() <= 4 * 800
    assert m.spill_report()["reads"] > 0


def test_the_registry_makes_one_by_name(tmp_path):
    m = get_memory_engine("spill", capacity=4000, memory=1000, path=str(tmp_path))
    assert m.kind == "host+file" and m.capacity() == 4000 and m.primary.capacity() == 1000
