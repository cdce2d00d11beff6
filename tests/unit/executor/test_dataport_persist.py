"""The executor's data port deletes a tile from its persistence targets too."""

from __future__ import annotations

import numpy as np

from triplane.engines.memory.host import HostMemoryEngine
from triplane.engines.memory.persist import persist_targets
from triplane.executor.dataport import EngineTiles


def test_a_deleted_tile_leaves_the_persistence_target_too(tmp_path) -> None:
    targets = persist_targets(f"file:{tmp_path}")
    tiles = EngineTiles(HostMemoryEngine(1 << 20), targets)
    tiles.store("j.t0", np.ones(4), 0)
    targets["file"].put("j.t0", np.ones(4))
    targets["file"].put("j.t1", np.zeros(4))
    tiles.delete("j.t0")
    assert "j.t0" not in tiles.engine and "j.t0" not in targets["file"]
    assert "j.t1" in targets["file"]  # another tile stays


def test_persist_specs_name_file_and_redis_targets(tmp_path) -> None:
    import pytest

    assert persist_targets(None) == {} and persist_targets("") == {}
    assert set(persist_targets(f"file:{tmp_path}")) == {"file"}
    with pytest.raises(ValueError, match="expected file:DIR or redis://"):
        persist_targets("s3://bucket")
