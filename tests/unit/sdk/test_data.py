"""DataLoader: every sample once an epoch, reproducible shuffles, datasets, threads and
seeded transforms; the digits dataset."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from triplane.sdk.data import DataLoader, Dataset, TensorDataset, datasets, transforms
from triplane.sdk.tensor import Tensor


@pytest.mark.parametrize("n,batch,drop_last", [(10, 3, False), (10, 3, True), (8, 4, False), (5, 8, False)])
def test_every_sample_once_per_epoch(n: int, batch: int, drop_last: bool) -> None:
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    y = np.arange(n, dtype=np.int64)
    dl = DataLoader(x, y, batch_size=batch, shuffle=True, seed=3, drop_last=drop_last)
    for _ in range(2):
        seen: list[int] = []
        batches = 0
        for xb, yb in dl:
            assert isinstance(xb, Tensor) and isinstance(yb, Tensor)
            assert xb.dtype.name == "float32" and yb.dtype.name == "int64"
            assert len(yb) == batch or not drop_last
            np.testing.assert_array_equal(xb.numpy()[:, 0], 2 * yb.numpy())  # rows stay paired
            seen.extend(yb.numpy().tolist())
            batches += 1
        assert batches == len(dl)
        if drop_last:
            assert len(seen) == n // batch * batch and len(set(seen)) == len(seen)
        else:
            assert sorted(seen) == list(range(n))


def test_shuffle_is_reproducible_and_changes_per_epoch() -> None:
    y = np.arange(50)

    def epochs(seed: int) -> list[list[int]]:
        dl = DataLoader(y, batch_size=50, shuffle=True, seed=seed)
        return [next(iter(dl)).numpy().tolist() for _ in range(2)]

    a, b, c = epochs(1), epochs(1), epochs(2)
    assert a == b
    assert a[0] != a[1], "two epochs had the same order"
    assert a != c
    assert a[0] != list(range(50))


def test_no_shuffle_keeps_order_and_single_array_yields_tensors() -> None:
    y = np.arange(7)
    got = [t.numpy().tolist() for t in DataLoader(y, batch_size=3)]
    assert got == [[0, 1, 2], [3, 4, 5], [6]]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"first dimension.*\(3,\), \(4,\)"):
        DataLoader(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(np.zeros(3), batch_size=0)
    with pytest.raises(ValueError, match="at least one array"):
        DataLoader()


def test_digits_dataset_is_deterministic_and_shaped() -> None:
    x, y = datasets.digits(n=200, synthetic=True, seed=1)
    x2, y2 = datasets.digits(n=200, synthetic=True, seed=1)
    assert x.shape == (200, 8, 8) and x.dtype == np.float32
    assert y.shape == (200,) and y.dtype == np.int64
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert set(y.tolist()) == set(range(10))
    assert x.min() >= 0 and x.max() <= 16
    # classes differ: the mean images of two classes are far apart
    assert np.abs(x[y == 1].mean(0) - x[y == 8].mean(0)).sum() > 50
    x_default, _ = datasets.digits()
    assert x_default.shape[1:] == (8, 8) and len(x_default) >= 1000


class _Squares(Dataset):
    """A map-style data set without __getitems__: samples are collated one by one."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((2,), float(i * i), np.float32), i


def test_a_dataset_batches_like_arrays() -> None:
    ds = _Squares()
    x = np.stack([ds[i][0] for i in range(11)])
    y = np.arange(11)
    got = [(a.numpy(), b.numpy()) for a, b in DataLoader(ds, batch_size=4, shuffle=True, seed=7)]
    want = [(a.numpy(), b.numpy()) for a, b in DataLoader(x, y, batch_size=4, shuffle=True, seed=7)]
    assert len(got) == len(want) == 3
    for (ga, gb), (wa, wb) in zip(got, want):
        np.testing.assert_array_equal(ga, wa)
        np.testing.assert_array_equal(gb, wb)
    td = TensorDataset(x, y)
    assert len(td) == 11 and td[3][1] == 3

    class Duck:  # shaped like a dataset (a PyTorch one, say) without subclassing Dataset
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> np.ndarray:
            return np.array([i, i])

    assert [b.numpy().tolist() for b in DataLoader(Duck(), batch_size=2)] == [[[0, 0], [1, 1]], [[2, 2]]]


def _batches(dl: DataLoader) -> list[list[np.ndarray]]:
    return [[t.numpy() for t in batch] for batch in dl]


def test_workers_give_the_same_batches_and_transforms_are_seeded() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 16, size=(50, 1, 8, 8)).astype(np.float32)
    y = np.arange(50)
    aug = transforms.Compose([transforms.RandomCrop(8, padding=1), transforms.RandomHorizontalFlip(),
                              transforms.Scale(1 / 16)])

    def loader(workers: int, seed: int = 3) -> DataLoader:
        return DataLoader(x, y, batch_size=8, shuffle=True, seed=seed, transform=aug, num_workers=workers)

    plain, threaded = loader(0), loader(2)
    for _ in range(2):  # two epochs each
        a, b = _batches(plain), _batches(threaded)
        assert len(a) == len(b) == 7
        for ba, bb in zip(a, b):
            for fa, fb in zip(ba, bb):
                np.testing.assert_array_equal(fa, fb)
    e0, e1 = _batches(loader(0)), _batches(loader(0))
    np.testing.assert_array_equal(e0[0][0], e1[0][0])  # same seed, same epoch: same batch
    again = loader(0)
    next(iter(again))
    assert not np.array_equal(_batches(again)[0][0], e0[0][0]), "epoch 1 repeated epoch 0's augmentation"
    assert e0[0][0].dtype == np.float32 and e0[0][0].max() <= 1.0


def test_leaving_a_threaded_loop_early_does_not_hang() -> None:
    dl = DataLoader(np.arange(1000), batch_size=1, num_workers=2)
    for i, _ in enumerate(dl):
        if i == 3:
            break
    assert sum(1 for _ in dl) == 1000


def test_bad_loader_options() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(np.zeros(3), num_workers=-1)
    with pytest.raises(AttributeError, match="walks a Dataset"):
        _ = DataLoader(_Squares()).arrays


def test_digits_without_scikit_learn_raises_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import sklearn...` raise ImportError, as if not installed.
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"pip install scikit-learn.*synthetic=True"):
        datasets.digits()
    x, _ = datasets.digits(n=20, synthetic=True)  # asked for explicitly, the stand-in still works
    assert x.shape == (20, 8, 8)
