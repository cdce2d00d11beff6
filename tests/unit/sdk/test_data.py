"""DataLoader: every sample once an epoch, reproducible shuffles; the digits dataset."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.sdk.data import DataLoader, datasets
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
