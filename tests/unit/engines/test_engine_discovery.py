"""One discovery path for op, memory and network engines: built-ins, then entry points;
and the memory-engine contract (the host engine through the conformance kit)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triplane.engines import registry
from triplane.engines.errors import EngineError, MemoryFullError, MissingTileError, UnknownEngineError
from triplane.engines.memory.host import HostMemoryEngine
from triplane.engines.memory.testing import MemoryEngineConformance
from triplane.engines.protocols import MemoryEngine, OpEngine, members, mismatches
from triplane.proto.errors import TriplaneError


class TestHostMemoryEngine(MemoryEngineConformance):
    @pytest.fixture
    def make_memory_engine(self) -> Any:
        return lambda capacity: registry.get_memory_engine("host", capacity=capacity)


def test_the_protocol_names_everything_the_executor_calls() -> None:
    assert set(members(MemoryEngine)) == {
        "name", "kind", "put", "get", "delete", "reserve", "release", "__contains__", "__len__", "keys",
        "capacity", "used", "cached", "free", "cache_put", "cache_take", "cache_done", "cache_drop",
        "cache_keys", "cache_report"}


def test_the_errors_are_in_the_triplane_tree_with_a_kind() -> None:
    for cls, kind in ((MemoryFullError, "unavailable"), (MissingTileError, "not_found"),
                      (UnknownEngineError, "not_found")):
        assert issubclass(cls, EngineError) and issubclass(cls, TriplaneError) and cls.kind == kind
    assert str(MissingTileError("no such tile: t1")) == "no such tile: t1"  # not KeyError's quoting


class _Short:
    """Lacks most of the protocol, and its put cannot take ``reserved``."""

    name = "short"
    kind = "test"

    def __init__(self, capacity: int) -> None:
        self.capacity_bytes = capacity

    def put(self, key: str, value: np.ndarray) -> None: ...

    def get(self, key: str, extra: int) -> np.ndarray:
        raise MissingTileError(key)


def test_mismatches_name_what_is_missing_or_callable_otherwise() -> None:
    problems = mismatches(_Short(1), MemoryEngine)
    assert "free: missing" in problems and "cache_take: missing" in problems
    assert "put: no parameter 'reserved'" in problems
    assert "get: extra required parameter 'extra'" in problems
    assert mismatches(HostMemoryEngine(10), MemoryEngine) == []


# --- entry points ------------------------------------------------------------------------------


class _Plugin:
    """What a vendor's entry point names: an op engine class."""

    name = "fake-op"
    device = "cpu"

    def supports(self, op: str, dtypes: Any = ()) -> bool:
        return op == "add"

    def run(self, op: str, inputs: Any, attrs: Any, out: Any) -> Any:
        return inputs[0] + inputs[1]

    def benchmark(self) -> dict[str, float]:
        return {"matmul_gflops": 1.0, "elementwise_gbps": 1.0}


def _dist(tmp_path: Path, groups: dict[str, dict[str, str]]) -> Path:
    """A tiny installed distribution (a module and its dist-info) under ``tmp_path``."""
    (tmp_path / "vendor_engines.py").write_text(textwrap.dedent('''
        from triplane.engines.memory.host import HostMemoryEngine

        class RamDisk(HostMemoryEngine):
            kind = "ramdisk"

            def __init__(self, capacity, name="ramdisk"):
                super().__init__(capacity, name)

        class NotAMemoryEngine:
            def __init__(self, capacity):
                self.capacity = capacity

        class Wire:
            def __init__(self, speed=1):
                self.speed = speed
    '''))
    info = tmp_path / "vendor_engines-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-engines\nVersion: 1.0\n")
    lines = []
    for group, eps in groups.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.fixture
def vendor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = _dist(tmp_path, {
        "triplane.engines.memory": {"ramdisk": "vendor_engines:RamDisk",
                                    "broken": "vendor_engines:NotAMemoryEngine",
                                    "host": "vendor_engines:NotAMemoryEngine"},
        "triplane.engines.network": {"wire": "vendor_engines:Wire"},
    })
    monkeypatch.syspath_prepend(str(path))
    yield path
    sys.modules.pop("vendor_engines", None)


def test_an_installed_memory_engine_is_found_by_name(vendor: Path) -> None:
    assert {"host", "ramdisk", "broken"} <= set(registry.memory_engine_names())
    engine = registry.get_memory_engine("ramdisk", capacity=1 << 10)
    assert engine.kind == "ramdisk" and engine.capacity() == 1 << 10 and isinstance(engine, MemoryEngine)


def test_a_built_in_wins_over_a_plugin_of_the_same_name(vendor: Path) -> None:
    assert isinstance(registry.get_memory_engine("host", capacity=10), HostMemoryEngine)


def test_a_plugin_that_breaks_the_protocol_is_refused_naming_what_is_missing(vendor: Path) -> None:
    with pytest.raises(TypeError, match=r"'broken'.*does not implement the MemoryEngine protocol.*put: "):
        registry.get_memory_engine("broken", capacity=10)


def test_a_network_engine_is_found_the_same_way(vendor: Path) -> None:
    assert "wire" in registry.engine_names("network")
    assert registry.get_network_engine("wire", speed=3).speed == 3


def test_unknown_names_list_the_known_ones(vendor: Path) -> None:
    known = r"unknown memory engine 'nvme' \(known: \[.*'host'.*'ramdisk'"
    with pytest.raises(UnknownEngineError, match=known):
        registry.get_memory_engine("nvme", capacity=10)
    built_ins_and_wire = r"unknown network engine 'rdma' \(known: \['tcp', 'udp', 'wire'\]\)"
    with pytest.raises(UnknownEngineError, match=built_ins_and_wire):
        registry.get_network_engine("rdma")
    with pytest.raises(ValueError, match="unknown engine kind 'gpu'"):
        registry.engine_names("gpu")


def test_an_op_engine_plugin_through_patched_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    ep = EntryPoint("fake-op", f"{__name__}:_Plugin", "triplane.engines.op")
    monkeypatch.setattr(registry, "entry_points",
                        lambda group: [ep] if group == "triplane.engines.op" else [])
    monkeypatch.setattr(registry, "_op_cache", {})
    assert "fake-op" in registry.op_engine_names()
    engine = registry.get_op_engine("fake-op")
    assert isinstance(engine, OpEngine) and engine is registry.get_op_engine("fake-op")
    assert mismatches(engine, OpEngine) == []


def test_the_executor_takes_its_memory_engine_from_discovery(vendor: Path) -> None:
    from triplane.executor.daemon import Executor

    ex = Executor(registry=None, secret=b"s" * 32, memory_bytes=1 << 20, memory_engine="ramdisk")  # type: ignore[arg-type]
    try:
        assert ex.store.kind == "ramdisk" and ex.store.capacity() == 1 << 20
        assert ex._memory_info().kind == "ramdisk"
    finally:
        ex.runner.close()
    with pytest.raises(UnknownEngineError, match="known:"):
        Executor(registry=None, secret=b"s" * 32, memory_bytes=1 << 20, memory_engine="nope")  # type: ignore[arg-type]
