"""TensorStore's small uploads: kept in memory and served from it; held ones (a compiled
step's inline inputs) live in memory only and never touch the disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from triplane.scheduler import store as store_mod
from triplane.scheduler.store import SMALL_BYTES, TensorStore, UploadTiles


def test_a_small_upload_is_served_from_memory_and_still_written(tmp_path: Path) -> None:
    s = TensorStore(tmp_path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = s.put(x.tobytes(), (3, 4), "float32", "alice")
    assert s.in_memory(t.id) and UploadTiles(s).cheap(t.id)
    (tmp_path / f"{t.id}.npy").unlink()  # served without its file
    assert bytes(s.data(t.id)) == x.tobytes()
    _, view = s.region(f"{t.id}@1:3,0:2")  # type: ignore[misc]
    assert view.tobytes() == np.ascontiguousarray(x[1:3, 0:2]).tobytes()
    big = np.zeros(SMALL_BYTES // 4 + 1, np.float32)
    b = s.put(big.tobytes(), big.shape, "float32")
    assert not s.in_memory(b.id) and bytes(s.data(b.id)) == big.tobytes()


def test_a_held_upload_is_served_from_memory_and_never_written(tmp_path: Path) -> None:
    s = TensorStore(tmp_path)
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    t = s.put(x.tobytes(), (3, 4), "int64", "bob", held=True)
    assert s.is_held(t.id) and s.in_memory(t.id) and list(tmp_path.iterdir()) == []
    assert bytes(s.data(t.id)) == x.tobytes() and s.array(t.id).tolist() == x.tolist()
    _, view = s.region(f"{t.id}@0:2,1:3")  # type: ignore[misc]
    assert view.tobytes() == np.ascontiguousarray(x[0:2, 1:3]).tobytes()
    carried = s.carried(t.id)
    assert carried is not None and carried.data == x.tobytes() and carried.shape == (3, 4)
    assert TensorStore(tmp_path).get(t.id) is None  # a restarted scheduler does not know it
    assert s.delete(t.id) and t.id not in s and not s.is_held(t.id) and not s.in_memory(t.id)
    assert not s.delete(t.id)


def test_held_uploads_past_their_budget_are_written_like_any_upload(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(store_mod, "HELD_TOTAL_BYTES", 100)
    s = TensorStore(tmp_path)
    raw = np.zeros(10, np.float32).tobytes()  # 40 bytes
    a, b, c = (s.put(raw, (10,), "float32", held=True) for _ in range(3))
    assert s.is_held(a.id) and s.is_held(b.id) and not s.is_held(c.id)
    assert (tmp_path / f"{c.id}.npy").exists() and bytes(s.data(c.id)) == raw
    assert s.delete(a.id)  # room again
    d = s.put(raw, (10,), "float32", held=True)
    assert s.is_held(d.id)
    big = np.zeros(SMALL_BYTES // 4 + 1, np.float32)  # over SMALL_BYTES: never held
    monkeypatch.setattr(store_mod, "HELD_TOTAL_BYTES", 1 << 30)
    e = s.put(big.tobytes(), big.shape, "float32", held=True)
    assert not s.is_held(e.id) and (tmp_path / f"{e.id}.npy").exists()


def test_an_upload_another_process_wrote_is_found_on_first_use(tmp_path: Path) -> None:
    """A standby shares the run directory: the uploads its leader stored after the standby
    started are found (and served) once asked for; ids that are not upload ids are not
    looked up on disk."""
    standby = TensorStore(tmp_path)
    x = np.arange(6, dtype=np.float32)
    t = TensorStore(tmp_path).put(x.tobytes(), (6,), "float32", "alice")  # the leader's
    assert t.id in standby and standby.get(t.id) == t
    assert bytes(standby.data(t.id)) == x.tobytes()
    assert standby.get("../meta") is None and standby.get("u-nothere") is None
