"""The host memory engine's capacity accounting."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.engines.errors import MemoryFullError, MissingTileError
from triplane.engines.memory.host import LOST_KEPT, HostMemoryEngine
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
    with pytest.raises(MissingTileError, match="no such tile: y"):
        m.get("y")
    assert str(MissingTileError("no such tile: y")) == "no such tile: y"


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


# --- cache entries (upload tiles kept by the executor) ----------------------------------


def test_cache_entries_are_reclaimable_and_evicted_least_recently_used_first() -> None:
    m = HostMemoryEngine(1000)
    assert m.cache_put("u-a", np.zeros(100, np.float32))  # 400 bytes
    assert m.cache_put("u-b", np.zeros(100, np.float32))  # 400 bytes
    assert (m.used(), m.cached(), m.free(), len(m)) == (0, 800, 1000, 0)  # reclaimable: free
    m.get("u-a")  # a read makes u-a the most recently used
    m.put("t", np.zeros(100, np.float32))  # needs 400: u-b goes, u-a stays
    assert m.cache_keys() == ["u-a"] and "u-b" not in m and "u-a" in m
    assert m.cache_stats["evictions"] == 1 and m.cache_stats["evicted_bytes"] == 400
    m.reserve(600)  # a reservation evicts too
    assert m.cache_keys() == [] and m.cached() == 0 and m.used() == 400


def test_an_entry_in_use_is_not_evicted_and_does_not_count_as_free() -> None:
    m = HostMemoryEngine(1000)
    assert m.cache_put("u-a", np.zeros(150, np.float32))  # 600 bytes
    got = m.cache_take("u-a")
    assert got is not None and not got.flags.writeable and m.free() == 400
    with pytest.raises(MemoryFullError):
        m.put("t", np.zeros(150, np.float32))  # the entry is read by a running task
    assert m.cache_keys() == ["u-a"] and m.used() == 0
    m.cache_done("u-a")
    m.put("t", np.zeros(150, np.float32))  # now it is evicted for the tile
    assert m.cache_keys() == [] and m.used() == 600


def test_cache_never_displaces_tiles_or_reservations() -> None:
    m = HostMemoryEngine(1000)
    m.put("t", np.zeros(150, np.float32))  # 600
    m.reserve(200)
    assert not m.cache_put("u-a", np.zeros(100, np.float32))  # 400 > the 200 left
    assert m.cache_stats["refused"] == 1  # the scheduler learns of it (docs/executor.md)
    assert m.cache_report()["lost"] == ["u-a"]
    assert m.cache_put("u-b", np.zeros(50, np.float32))  # 200 fit
    assert not m.cache_put("t", np.zeros(1, np.float32))  # a tile of that id wins
    assert m.cache_take("u-missing") is None
    assert (m.used(), m.cached(), m.free()) == (600, 200, 200)
    m.delete("u-b")  # delete drops an entry too
    assert m.cached() == 0 and "u-b" not in m


def test_the_report_names_the_latest_lost_entries_oldest_first() -> None:
    m = HostMemoryEngine(1000)
    for i in range(LOST_KEPT + 3):  # each new 800-byte entry evicts the one before
        assert m.cache_put(f"u-{i}", np.zeros(200, np.float32))
    assert m.cache_put("u-last", np.zeros(10, np.float32)) is True  # fits beside: evicts none
    assert m.cache_take("u-last") is not None
    m.cache_drop("u-last")  # given up by its reader: lost too
    report = m.cache_report()
    assert (report["evictions"], report["dropped"], report["refused"]) == (LOST_KEPT + 2, 1, 0)
    assert report["lost"] == [f"u-{i}" for i in range(3, LOST_KEPT + 2)] + ["u-last"]
    assert len(report["lost"]) == LOST_KEPT
