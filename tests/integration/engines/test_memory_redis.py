"""The redis memory engine against a real redis-server: the conformance kit, TTLs, pipelines."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from triplane.engines.errors import CorruptTileError, MemoryFullError
from triplane.engines.memory.redis_engine import RedisMemoryEngine
from triplane.engines.memory.testing import MemoryEngineConformance

_prefixes = itertools.count()


class TestRedisMemoryEngine(MemoryEngineConformance):
    @pytest.fixture
    def prefix(self):
        return f"t{next(_prefixes)}"

    @pytest.fixture
    def make_memory_engine(self, redis_url, prefix):
        return lambda capacity: RedisMemoryEngine(capacity, url=redis_url, prefix=prefix)

    @pytest.fixture
    def reopen_memory_engine(self, redis_url, prefix):
        return lambda capacity: RedisMemoryEngine(capacity, url=redis_url, prefix=prefix)


def test_cache_entries_carry_a_ttl_and_an_expired_one_is_reported_lost(redis_url):
    m = RedisMemoryEngine(1 << 20, url=redis_url, prefix="ttl", cache_ttl_s=0.2)
    m.put("t", np.ones(10))
    assert m.cache_put("u-1", np.ones(10))
    assert 0 < m.client.pttl("ttl:cache:u-1") <= 200 and m.client.pttl("ttl:tile:t") == -1  # tiles: no TTL
    time.sleep(0.4)
    assert m.cache_take("u-1") is None and m.cache_report()["lost"] == ["u-1"] and m.cached() == 0


def test_put_many_and_get_many_are_one_round_trip_each_and_all_or_none(redis_url):
    m = RedisMemoryEngine(8000, url=redis_url, prefix="many")
    m.put_many({"a": np.full(100, 1.0), "b": np.full(100, 2.0)})
    assert m.used() == 1600
    a, b = m.get_many(["a", "b"])
    assert float(a[0]) == 1.0 and float(b[99]) == 2.0
    with pytest.raises(MemoryFullError):
        m.put_many({"c": np.ones(500), "d": np.ones(500)})
    assert "c" not in m and m.used() == 1600 and m.free() == 8000 - 1600


def test_a_damaged_value_is_a_corrupt_tile(redis_url):
    m = RedisMemoryEngine(1 << 20, url=redis_url, prefix="bad")
    m.put("x", np.arange(10.0))
    blob = bytearray(m.client.get("bad:tile:x"))
    blob[-1] ^= 1
    m.client.set("bad:tile:x", bytes(blob))
    with pytest.raises(CorruptTileError, match="checksum mismatch"):
        m.get("x")
