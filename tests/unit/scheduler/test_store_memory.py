"""TensorStore's small uploads: kept in memory and served from it; with ``later`` their
files are written off the caller's path, in order with their deletion."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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


def test_put_later_writes_the_files_behind_and_delete_queues_after_them(tmp_path: Path) -> None:
    s = TensorStore(tmp_path)
    x = np.arange(6, dtype=np.int64)
    kept = s.put(x.tobytes(), (6,), "int64", "bob", later=True)
    assert bytes(s.data(kept.id)) == x.tobytes()  # at once, from memory
    gone = s.put(x.tobytes(), (6,), "int64", later=True)
    assert s.delete(gone.id) and gone.id not in s
    s._io.submit(lambda: None).result()  # every queued write and deletion done
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{kept.id}.json", f"{kept.id}.npy"]
    again = TensorStore(tmp_path)  # a restarted scheduler finds the written one
    assert again.get(kept.id) == kept and bytes(again.data(kept.id)) == x.tobytes()


def test_an_inline_inputs_delete_queues_its_unlink_on_the_writer_thread(tmp_path: Path) -> None:
    """A ``later`` upload's delete does no I/O on the caller (the unlink follows its write on
    the store's one thread), after its write too; a plain upload's delete unlinks at once."""
    store = TensorStore(tmp_path)
    raw = np.arange(4, dtype=np.float32).tobytes()
    inline, plain = store.put(raw, (4,), "float32", later=True), store.put(raw, (4,), "float32")
    store._written(inline.id)  # its files are on disk now
    assert store.deletes_behind(inline.id) and not store.deletes_behind(plain.id)
    assert (tmp_path / f"{inline.id}.npy").exists() and (tmp_path / f"{plain.id}.npy").exists()
    assert store.delete(plain.id) and not (tmp_path / f"{plain.id}.npy").exists()
    assert store.delete(inline.id) and not store.deletes_behind(inline.id)
    store._io.submit(lambda: None).result()  # the thread's queue, in order, is done
    assert not (tmp_path / f"{inline.id}.npy").exists() and not (tmp_path / f"{inline.id}.json").exists()
