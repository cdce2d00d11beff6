"""Feeding host data to models: :class:`DataLoader` and small bundled :mod:`datasets`.

A DataLoader walks numpy arrays (all with the same first dimension) in batches and
yields one Tensor per array. Each epoch visits every sample exactly once (the last,
shorter batch is dropped only with ``drop_last``). With ``shuffle`` the order of epoch
``e`` is a permutation drawn from ``numpy.random.default_rng((seed, e))``: reproducible
for a given seed, different from epoch to epoch.

Nothing here downloads: :func:`datasets.digits` reads scikit-learn's bundled copy when
scikit-learn is installed, else makes a deterministic synthetic stand-in.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from triplane.sdk.tensor import Tensor

__all__ = ["DataLoader", "datasets"]


class DataLoader:
    """Batches of ``arrays`` as Tensors: ``for x, y in DataLoader(X, Y, batch_size=32): ...``

    A single array yields single Tensors rather than 1-tuples.
    """

    def __init__(self, *arrays: Any, batch_size: int = 32, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False) -> None:
        if not arrays:
            raise ValueError("DataLoader needs at least one array")
        self.arrays = [np.asarray(a) for a in arrays]
        n = {a.shape[0] if a.ndim else -1 for a in self.arrays}
        if len(n) != 1 or -1 in n:
            shapes = ", ".join(str(a.shape) for a in self.arrays)
            raise ValueError(f"DataLoader: arrays must share their first dimension, got shapes {shapes}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got {batch_size!r}")
        self.n = n.pop()
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The sample indices of ``epoch``, in visiting order."""
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng((self.seed, epoch)).permutation(self.n)

    def __iter__(self) -> Iterator[Any]:
        idx = self.order(self.epoch)
        self.epoch += 1
        for b in range(len(self)):
            sel = idx[b * self.batch_size:(b + 1) * self.batch_size]
            batch = tuple(Tensor.from_array(a[sel]) for a in self.arrays)
            yield batch[0] if len(batch) == 1 else batch


# --- datasets -------------------------------------------------------------------------

# Seven-segment glyphs on an 8x8 grid: segment -> pixels it lights.
_SEGMENTS = {
    "a": [(1, c) for c in range(2, 6)], "d": [(6, c) for c in range(2, 6)],
    "g": [(4, c) for c in range(2, 6)],
    "f": [(r, 1) for r in range(1, 5)], "b": [(r, 6) for r in range(1, 5)],
    "e": [(r, 1) for r in range(4, 7)], "c": [(r, 6) for r in range(4, 7)],
}
_DIGIT_SEGMENTS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def _synthetic_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    glyphs = np.zeros((10, 8, 8))
    for d, segs in enumerate(_DIGIT_SEGMENTS):
        for s in segs:
            for r, c in _SEGMENTS[s]:
                glyphs[d, r, c] = 1.0
    labels = np.arange(n) % 10
    rng.shuffle(labels)
    images = glyphs[labels] * rng.uniform(10, 16, size=(n, 1, 1))
    # A one-pixel jitter and pixel noise make it a (small) learning problem.
    for i, (dr, dc) in enumerate(rng.integers(-1, 2, size=(n, 2))):
        images[i] = np.roll(images[i], (dr, dc), axis=(0, 1))
    images += rng.normal(0, 2.0, size=images.shape)
    return np.clip(images, 0, 16).astype(np.float32), labels.astype(np.int64)


def _digits(n: int | None = None, seed: int = 0, synthetic: bool | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """8x8 grey images of digits (values 0..16, float32, shape (n, 8, 8)) and int64 labels.

    scikit-learn's bundled copy (1797 images) when it is installed and ``synthetic`` is not
    True; else ``n`` (default 1797) deterministic synthetic images from ``seed``.
    """
    if not synthetic:
        try:
            from sklearn.datasets import load_digits  # type: ignore[import-not-found]
        except ImportError:
            if synthetic is False:
                raise
        else:
            d = load_digits()
            x, y = d.images.astype(np.float32), d.target.astype(np.int64)
            return (x[:n], y[:n]) if n is not None else (x, y)
    return _synthetic_digits(1797 if n is None else n, seed)


datasets = SimpleNamespace(digits=_digits)
