"""The file memory engine: the conformance kit, atomic checksummed files, persistence."""

from __future__ import annotations

import os

import numpy as np
import pytest

from triplane.engines.errors import CorruptTileError, MissingTileError
from triplane.engines.memory.file import FileMemoryEngine
from triplane.engines.memory.testing import MemoryEngineConformance
from triplane.engines.registry import get_memory_engine


class TestFileMemoryEngine(MemoryEngineConformance):
    @pytest.fixture
    def make_memory_engine(self, tmp_path):
        return lambda capacity: FileMemoryEngine(capacity, path=tmp_path / "store")

    @pytest.fixture
    def reopen_memory_engine(self, tmp_path):
        return lambda capacity: FileMemoryEngine(capacity, path=tmp_path / "store")


def test_a_damaged_file_is_a_corrupt_tile_naming_the_file(tmp_path):
    m = FileMemoryEngine(1 << 20, path=tmp_path)
    m.put("j.t:0", np.arange(100, dtype=np.float32))
    p = m.where("j.t:0")
    blob = bytearray(p.read_bytes())
    blob[-3] ^= 0xFF  # flip a byte of the data
    p.write_bytes(bytes(blob))
    with pytest.raises(CorruptTileError, match="checksum mismatch") as e:
        m.get("j.t:0")
    assert str(p) in str(e.value)
    assert isinstance(e.value, MissingTileError)  # a corrupt tile is a lost tile
    p.write_bytes(bytes(blob[:-8]))  # truncated
    with pytest.raises(CorruptTileError, match="data bytes"):
        m.get("j.t:0")


def test_writes_are_atomic_and_leave_no_temporaries(tmp_path):
    m = FileMemoryEngine(1 << 20, path=tmp_path)
    m.put("a", np.ones(1000))
    (tmp_path / "tiles" / ".dead.tmp").write_bytes(b"half a tile")  # a write that died
    assert sorted(os.listdir(tmp_path / "tiles")) == sorted([".dead.tmp", m.where("a").name])
    again = FileMemoryEngine(1 << 20, path=tmp_path)
    assert os.listdir(tmp_path / "tiles") == [m.where("a").name] and again.used() == 8000


def test_a_tile_another_process_stored_is_read_on_demand(tmp_path):
    writer = FileMemoryEngine(1 << 20, path=tmp_path)
    reader = FileMemoryEngine(1 << 20, path=tmp_path)  # started before the write
    writer.put("j.t:3", np.full((4, 4), 7, dtype=np.int32))
    assert "j.t:3" in reader
    np.testing.assert_array_equal(reader.get("j.t:3"), np.full((4, 4), 7, dtype=np.int32))
    assert reader.used() == 0  # not its tile: not counted


def test_a_tile_another_process_stored_is_deleted_by_a_release_here(tmp_path):
    writer, other = FileMemoryEngine(1 << 20, path=tmp_path), FileMemoryEngine(1 << 20, path=tmp_path)
    writer.put("job.t:0", np.arange(4.0))  # after `other` was made: it did not count it
    assert "job.t:0" in other and other.used() == 0
    other.delete("job.t:0")
    assert "job.t:0" not in FileMemoryEngine(1 << 20, path=tmp_path)
    with pytest.raises(MissingTileError):
        writer.get("job.t:0")
    assert other.used() == 0
    other.delete("job.t:0")  # still idempotent


def test_the_registry_makes_a_file_engine_by_name(tmp_path):
    m = get_memory_engine("file", capacity=1000, path=str(tmp_path))
    assert isinstance(m, FileMemoryEngine) and m.kind == "file" and m.path == tmp_path
