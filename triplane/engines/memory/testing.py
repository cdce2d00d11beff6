"""The memory-engine conformance kit: run it against your engine.

Checks an engine against :class:`triplane.engines.protocols.MemoryEngine`: every member
the protocol names exists and can be called as it says, and the behaviour the executor
relies on (tiles, errors, reservations, accounting, cache entries). A vendor's test suite
reuses the pytest mixin with a fixture that makes an engine of a given capacity::

    from triplane.engines.memory.testing import MemoryEngineConformance

    class TestMyEngine(MemoryEngineConformance):
        @pytest.fixture
        def make_memory_engine(self):
            return lambda capacity: MyEngine(capacity=capacity)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from triplane.engines.errors import MemoryFullError, MissingTileError
from triplane.engines.protocols import MemoryEngine, mismatches

__all__ = ["MemoryEngineConformance"]

Make = Callable[[int], Any]


def _arr(nbytes: int, fill: float = 1.0) -> np.ndarray:
    return np.full(nbytes // 8, fill, dtype=np.float64)


class MemoryEngineConformance:
    """A pytest mixin: subclass it and provide a ``make_memory_engine`` fixture (a callable
    taking a capacity in bytes)."""

    def test_implements_every_member_of_the_protocol(self, make_memory_engine: Make) -> None:
        engine = make_memory_engine(1 << 20)
        assert mismatches(engine, MemoryEngine) == []
        assert isinstance(engine, MemoryEngine)
        assert isinstance(engine.name, str) and engine.name and isinstance(engine.kind, str)

    def test_put_get_delete(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        m.put("a", _arr(400, 2.0))
        assert "a" in m and len(m) == 1 and m.keys() == ["a"]
        np.testing.assert_array_equal(np.asarray(m.get("a")), _arr(400, 2.0))
        assert m.used() == 400 and m.capacity() == 1000 and m.free() == 600
        m.put("a", _arr(200))  # replaces, and accounts the difference
        assert m.used() == 200
        m.delete("a")
        m.delete("a")  # idempotent
        assert "a" not in m and len(m) == 0 and m.used() == 0

    def test_a_stored_array_is_read_only(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        m.put("a", _arr(80))
        with pytest.raises(ValueError):
            m.get("a")[0] = 5.0
        assert float(m.get("a")[0]) == 1.0

    def test_a_missing_tile_raises_missing_tile_error(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        with pytest.raises(MissingTileError):
            m.get("nope")
        with pytest.raises(KeyError):  # it is a KeyError too
            m.get("nope")

    def test_a_tile_that_does_not_fit_raises_memory_full(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        m.put("a", _arr(800))
        with pytest.raises(MemoryFullError):
            m.put("b", _arr(400))
        assert "b" not in m and m.used() == 800

    def test_reservations_claim_bytes_until_put_or_release(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        m.reserve(600, "a")
        assert m.free() == 400
        with pytest.raises(MemoryFullError):
            m.reserve(600)
        m.put("a", _arr(600), reserved=600)
        assert m.used() == 600 and m.free() == 400
        m.reserve(400)
        m.release(400)
        assert m.free() == 400
        m.reserve(600, "a")  # a held key's bytes count as available: the put replaces it
        m.release(600)

    def test_cache_entries_share_the_capacity_but_give_way_to_tiles(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        assert m.cache_put("u1", _arr(400)) and m.cache_put("u2", _arr(400))
        assert m.cached() == 800 and m.used() == 0 and m.free() == 1000 and len(m) == 0
        assert "u1" in m and m.cache_keys() == ["u1", "u2"]
        m.put("t", _arr(400))  # evicts the least recently used entry
        assert m.cache_keys() == ["u2"] and "u1" not in m
        report = m.cache_report()
        assert report["evictions"] == 1 and report["lost"] == ["u1"]

    def test_an_entry_in_use_is_never_evicted(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        assert m.cache_put("u", _arr(600))
        held = m.cache_take("u")
        assert held is not None and m.free() == 400
        with pytest.raises(MemoryFullError):
            m.put("t", _arr(600))
        m.cache_done("u")
        m.put("t", _arr(600))
        assert m.cache_take("u") is None

    def test_cache_drop_forgets_an_entry(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        assert m.cache_put("u", _arr(80))
        m.cache_drop("u")
        assert "u" not in m and m.cached() == 0
        report = m.cache_report()
        assert report["dropped"] == 1 and report["lost"] == ["u"]
