"""The memory-engine conformance kit: run it against your engine.

Checks an engine against :class:`triplane.engines.protocols.MemoryEngine`: every member
the protocol names exists and can be called as it says, and the behaviour the executor
relies on (tiles, errors, reservations, honest accounting, capacity limits, cache
entries, concurrent use from threads). A persistent engine (file, redis) also provides a
``reopen_memory_engine`` fixture: a callable making a second engine over the same
storage, which must find the first one's tiles (otherwise that check is skipped). A
vendor's test suite reuses the pytest mixin with a fixture that makes an engine of a
given capacity::

    from triplane.engines.memory.testing import MemoryEngineConformance

    class TestMyEngine(MemoryEngineConformance):
        @pytest.fixture
        def make_memory_engine(self):
            return lambda capacity: MyEngine(capacity=capacity)

From a shell, ``python -m triplane.engines.testing --engine NAME`` (or ``--kind memory``)
runs the same tests on an installed engine, grouped into named checks (:data:`CHECKS`),
and prints a table of pass, FAIL or skip with the first failure of each; built-ins that
keep their tiles somewhere take ``--option`` (``--option url=redis://HOST:PORT/0``). Each
engine the kit makes gets storage of its own (a new directory for a ``path``, a new key
prefix for a ``prefix``), and a second engine over the same storage is the reopen check.
"""

from __future__ import annotations

import inspect
import itertools
import os
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triplane.engines.checks import Check
from triplane.engines.errors import MemoryFullError, MissingTileError
from triplane.engines.protocols import MemoryEngine, mismatches

__all__ = ["CHECKS", "MemoryEngineConformance", "check_memory_engine", "memory_engine_makers"]

Make = Callable[[int], Any]


def _arr(nbytes: int, fill: float = 1.0) -> np.ndarray:
    return np.full(nbytes // 8, fill, dtype=np.float64)


def _host(engine: Any, value: Any) -> np.ndarray:
    """A value the engine returned, on the host: through its explicit ``to_host`` copy if it
    has one (a device engine), else as it is."""
    to_host = getattr(engine, "to_host", None)
    return np.asarray(to_host(value) if to_host is not None else value)


class MemoryEngineConformance:
    """A pytest mixin: subclass it and provide a ``make_memory_engine`` fixture (a callable
    taking a capacity in bytes)."""

    @pytest.fixture
    def reopen_memory_engine(self) -> Make | None:
        """Override for a persistent engine: makes a second engine over the first one's storage."""
        return None

    def test_implements_every_member_of_the_protocol(self, make_memory_engine: Make) -> None:
        engine = make_memory_engine(1 << 20)
        assert mismatches(engine, MemoryEngine) == []
        assert isinstance(engine, MemoryEngine)
        assert isinstance(engine.name, str) and engine.name and isinstance(engine.kind, str)

    def test_put_get_delete(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        m.put("a", _arr(400, 2.0))
        assert "a" in m and len(m) == 1 and m.keys() == ["a"]
        np.testing.assert_array_equal(_host(m, m.get("a")), _arr(400, 2.0))
        assert m.used() == 400 and m.capacity() == 1000 and m.free() == 600
        m.put("a", _arr(200))  # replaces, and accounts the difference
        assert m.used() == 200
        m.delete("a")
        m.delete("a")  # idempotent
        assert "a" not in m and len(m) == 0 and m.used() == 0

    def test_a_stored_array_is_read_only(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1000)
        m.put("a", _arr(80))
        if hasattr(m, "to_host"):
            pytest.skip("a device engine's arrays cannot be write-protected (read-only by contract)")
        with pytest.raises(ValueError):
            m.get("a")[0] = 5.0
        assert float(_host(m, m.get("a"))[0]) == 1.0

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

    def test_accounting_is_honest_across_puts_replacements_deletes(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(4096)
        sizes = {"a": 800, "b": 1600, "c": 8}
        for k, n in sizes.items():
            m.put(k, _arr(n))
        assert m.used() == sum(sizes.values()) and len(m) == 3 and sorted(m.keys()) == ["a", "b", "c"]
        m.put("b", _arr(400))
        m.delete("c")
        assert m.used() == 1200 and m.free() == 4096 - 1200
        m.put("d", _arr(4096 - 1200))  # exactly full
        assert m.free() == 0
        with pytest.raises(MemoryFullError):
            m.put("e", _arr(8))
        with pytest.raises(MemoryFullError):
            m.reserve(8)
        for k in list(m.keys()):
            m.delete(k)
        assert m.used() == 0 and m.free() == 4096 and len(m) == 0

    def test_dtypes_and_shapes_come_back_exactly(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(1 << 16)
        arrays = {"f32": np.arange(12, dtype=np.float32).reshape(3, 4),
                  "i64": np.arange(-5, 5, dtype=np.int64), "b": np.array([[True, False]]),
                  "scalar": np.array(2.5, dtype=np.float64), "empty": np.zeros((0, 3), dtype=np.float32)}
        for k, a in arrays.items():
            m.put(k, a)
        for k, a in arrays.items():
            got = _host(m, m.get(k))
            assert got.dtype == a.dtype and got.shape == a.shape, k
            np.testing.assert_array_equal(got, a)

    def test_concurrent_use_from_threads_keeps_the_books(self, make_memory_engine: Make) -> None:
        m = make_memory_engine(64 * 800)
        errors: list[BaseException] = []

        def worker(w: int) -> None:
            try:
                for i in range(25):
                    key = f"w{w}.{i % 4}"
                    m.put(key, _arr(800, float(w)))
                    got = _host(m, m.get(key))
                    assert got.shape == (100,) and float(got[0]) == float(w)
                    m.reserve(80)
                    m.release(80)
                    if i % 3 == 0:
                        m.delete(key)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert m.used() == 800 * len(m) and m.free() == m.capacity() - m.used()
        held = m.keys()  # the engine is not iterable: the protocol names keys()
        for k in held:
            assert float(_host(m, m.get(k))[0]) == float(k[1:].partition(".")[0])

    def test_a_persistent_engine_finds_its_tiles_again(self, make_memory_engine: Make,
                                                        reopen_memory_engine: Make | None) -> None:
        if reopen_memory_engine is None:
            pytest.skip("not a persistent engine (no reopen_memory_engine fixture)")
        m = make_memory_engine(4096)
        m.put("job.t:0", _arr(800, 3.0))
        m.put("gone", _arr(80))
        m.delete("gone")
        again = reopen_memory_engine(4096)
        assert "job.t:0" in again, "a second engine over the same storage does not find the first one's tile"
        assert "gone" not in again, "a second engine over the same storage finds a deleted tile"
        np.testing.assert_array_equal(_host(again, again.get("job.t:0")), _arr(800, 3.0))
        assert again.used() == 800 and again.keys() == ["job.t:0"]


# The kit's named checks, each the mixin's tests it runs (in this order).
CHECKS: dict[str, tuple[str, ...]] = {
    "protocol": ("test_implements_every_member_of_the_protocol",),
    "tiles": ("test_put_get_delete", "test_a_missing_tile_raises_missing_tile_error",
              "test_dtypes_and_shapes_come_back_exactly", "test_a_stored_array_is_read_only"),
    "accounting": ("test_accounting_is_honest_across_puts_replacements_deletes",
                   "test_reservations_claim_bytes_until_put_or_release"),
    "capacity": ("test_a_tile_that_does_not_fit_raises_memory_full",),
    "cache entries": ("test_cache_entries_share_the_capacity_but_give_way_to_tiles",
                      "test_an_entry_in_use_is_never_evicted", "test_cache_drop_forgets_an_entry"),
    "concurrency": ("test_concurrent_use_from_threads_keeps_the_books",),
    "reopen/persistence": ("test_a_persistent_engine_finds_its_tiles_again",),
}


def check_memory_engine(make: Make, reopen: Make | None = None) -> list[Check]:
    """Every check of :data:`CHECKS` against ``make`` (a callable taking a capacity);
    ``reopen`` makes a second engine over the last one's storage (None: not persistent,
    that check is skipped). An engine that raises fails the check, naming the test and
    the exception; it does not stop the kit."""
    t = time.perf_counter()
    try:
        make(1 << 20)
    except Exception as e:  # one line, not the same error under every check
        return [Check("made", False, f"cannot be made: {type(e).__name__}: {e}", time.perf_counter() - t)]
    kit = MemoryEngineConformance()
    out = []
    for name, tests in CHECKS.items():
        t, problems, skipped = time.perf_counter(), [], []
        for test in tests:
            fn = getattr(kit, test)
            try:
                if "reopen_memory_engine" in inspect.signature(fn).parameters:
                    fn(make, reopen)
                else:
                    fn(make)
            except pytest.skip.Exception as e:
                skipped.append(str(e.msg) if hasattr(e, "msg") else str(e))
            except BaseException as e:  # AssertionError and whatever the engine raised
                if isinstance(e, KeyboardInterrupt):
                    raise
                problems.append(f"{test.removeprefix('test_')}: {_why(e)}")
        seconds = time.perf_counter() - t
        if problems:
            out.append(Check(name, False, "; ".join(problems), seconds))
        else:
            only_skips = len(skipped) == len(tests)
            detail = "; ".join(skipped) if only_skips else ""
            out.append(Check(name, True, detail, seconds, skipped=only_skips))
    return out


def _why(e: BaseException) -> str:
    """The exception in one line; a bare failed ``assert`` names its line of this kit."""
    words = str(e).strip().splitlines()
    if words:
        return f"{type(e).__name__}: {words[0]}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == __file__]
    return f"{type(e).__name__} at `{frames[-1].line}`" if frames and frames[-1].line else type(e).__name__


@contextmanager
def memory_engine_makers(name: str, options: Mapping[str, Any] | None = None
                         ) -> Iterator[tuple[Make, Make | None]]:
    """(make, reopen) for the installed memory engine ``name`` made with ``options``
    (keyword arguments of its factory). Where the factory takes a ``path`` or a ``prefix``
    each engine made gets a fresh one (under ``path`` / after ``prefix`` when given) and
    ``reopen`` makes another over the last one's; otherwise ``reopen`` is None. On exit the
    directories made are removed and the tiles left in the engines deleted."""
    from triplane.engines.registry import engine_factory

    factory = engine_factory("memory", name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    options = dict(options or {})
    root = Path(options.pop("path")) if "path" in params and "path" in options else None
    scratch = tempfile.mkdtemp(prefix="triplane-kit-") if "path" in params and root is None else None
    base = str(options.pop("prefix", "triplane-kit")) if "prefix" in params else ""
    counter, last, made = itertools.count(), {}, []

    def storage() -> dict[str, Any]:
        n = f"{os.getpid()}-{next(counter)}"
        if "path" in params:
            return {"path": str((root or Path(str(scratch))) / f"kit-{n}")}
        if "prefix" in params:
            return {"prefix": f"{base}-{n}"}
        return {}

    def make(capacity: int) -> Any:
        last.clear()
        last.update(storage())
        engine = factory(capacity=capacity, **options, **last)
        made.append(engine)
        return engine

    def again(capacity: int) -> Any:
        engine = factory(capacity=capacity, **options, **last)
        made.append(engine)
        return engine

    try:
        # An engine over a directory or key prefix is reopened unless it says it is not
        # persistent (a spilling engine: its fast tier dies with the process).
        persistent = ("path" in params or "prefix" in params) and getattr(factory, "persistent", True)
        yield make, (again if persistent else None)
    finally:
        for engine in made:
            try:
                for key in list(engine.keys()):
                    engine.delete(key)
                for key in list(engine.cache_keys()):
                    engine.cache_drop(key)
            except Exception:  # an engine that broke while checked: nothing more to tidy
                pass
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
