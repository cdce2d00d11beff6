"""Datasets and the DataLoader: host data in batches of Tensors.

A DataLoader walks either numpy arrays (``DataLoader(X, Y, batch_size=32)``, all with
the same first dimension) or a :class:`Dataset` (``DataLoader(ds, batch_size=32)``), and
yields one Tensor per field. Each epoch visits every sample exactly once (the last,
shorter batch is dropped only with ``drop_last``). With ``shuffle`` the order of epoch
``e`` is a permutation drawn from ``numpy.random.default_rng((seed, e))``.

``transform`` (see :mod:`triplane.sdk.data.transforms`) applies to the first field of
each batch (the inputs), with a generator seeded by ``(seed, epoch, batch index)``: a
run repeats exactly, and does not depend on ``num_workers``. With ``num_workers > 0``,
that many threads prepare the next batches while the model trains (numpy releases the
GIL in copies and most transforms); batches still come in order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from triplane.sdk.tensor import Tensor

__all__ = ["DataLoader", "Dataset", "TensorDataset"]

Transform = Callable[[np.ndarray, np.random.Generator], np.ndarray]


class Dataset:
    """Map-style data set: subclass it and define ``__len__`` and ``__getitem__(i)``,
    returning one sample (an array, or a tuple of arrays/numbers, one per field).
    Optionally ``__getitems__(indices)`` returns a whole batch as a tuple of stacked
    arrays (faster; :class:`TensorDataset` has it)."""

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not define __len__")

    def __getitem__(self, i: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define __getitem__")


class TensorDataset(Dataset):
    """Samples are the rows of ``arrays`` (all with the same first dimension)."""

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        self.arrays = [np.asarray(a.numpy() if isinstance(a, Tensor) else a) for a in arrays]
        n = {a.shape[0] if a.ndim else -1 for a in self.arrays}
        if len(n) != 1 or -1 in n:
            shapes = ", ".join(str(a.shape) for a in self.arrays)
            raise ValueError(f"arrays must share their first dimension, got shapes {shapes}")
        self.n = n.pop()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, ...]:
        return tuple(a[i] for a in self.arrays)

    def __getitems__(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(a[idx] for a in self.arrays)


def _is_dataset(obj: Any) -> bool:
    """A Dataset, or any object shaped like one (``__len__`` and ``__getitem__``, e.g. a
    PyTorch map-style dataset) that is not array-like data itself."""
    if isinstance(obj, Dataset):
        return True
    if isinstance(obj, (np.ndarray, Tensor, list, tuple)) or hasattr(obj, "__array__"):
        return False
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def _collate(samples: list[Any]) -> tuple[np.ndarray, ...]:
    first = samples[0]
    if isinstance(first, tuple | list):
        return tuple(np.stack([np.asarray(s[k]) for s in samples]) for k in range(len(first)))
    return (np.stack([np.asarray(s) for s in samples]),)


class DataLoader:
    """Batches of ``arrays`` (or of one :class:`Dataset`) as Tensors:
    ``for x, y in DataLoader(X, Y, batch_size=32, shuffle=True, seed=0): ...``

    A single field yields single Tensors rather than 1-tuples.
    """

    def __init__(self, *arrays: Any, batch_size: int = 32, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, transform: Transform | None = None, num_workers: int = 0) -> None:
        if not arrays:
            raise ValueError("DataLoader needs at least one array, or a Dataset")
        if len(arrays) == 1 and _is_dataset(arrays[0]):
            self.dataset: Dataset = arrays[0]
        else:
            try:
                self.dataset = TensorDataset(*arrays)
            except ValueError as e:
                raise ValueError(f"DataLoader: {e}") from None
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be an integer >= 0, got {num_workers!r}")
        self.n = len(self.dataset)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.transform, self.num_workers = transform, num_workers
        self.epoch = 0
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def arrays(self) -> list[np.ndarray]:
        """The arrays walked (when built from arrays)."""
        if not isinstance(self.dataset, TensorDataset):
            raise AttributeError("this DataLoader walks a Dataset, not arrays")
        return self.dataset.arrays

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The sample indices of ``epoch``, in visiting order."""
        cached = self._order
        if cached is not None and cached[0] == epoch:
            return cached[1]
        if self.shuffle:
            idx = np.random.default_rng((self.seed, epoch)).permutation(self.n)
        else:
            idx = np.arange(self.n)
        self._order = (epoch, idx)
        return idx

    def batch(self, epoch: int, b: int) -> tuple[np.ndarray, ...]:
        """Batch ``b`` of ``epoch`` as numpy arrays, transformed (what ``__iter__`` wraps)."""
        sel = self.order(epoch)[b * self.batch_size:(b + 1) * self.batch_size]
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            fields = tuple(getitems(sel))
        else:
            fields = _collate([self.dataset[int(i)] for i in sel])
        if self.transform is not None:
            rng = np.random.default_rng((self.seed, epoch, b))
            fields = (np.asarray(self.transform(fields[0], rng)), *fields[1:])
        return fields

    def _tensors(self, epoch: int, b: int) -> Any:
        batch = tuple(Tensor.from_array(a) for a in self.batch(epoch, b))
        return batch[0] if len(batch) == 1 else batch

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        self.epoch += 1
        if self.num_workers == 0:
            for b in range(len(self)):
                yield self._tensors(epoch, b)
            return
        with ThreadPoolExecutor(self.num_workers, thread_name_prefix="triplane-data") as pool:
            ahead: deque[Future[Any]] = deque()
            nxt = 0
            try:
                for _ in range(len(self)):
                    while nxt < len(self) and len(ahead) < 2 * self.num_workers:
                        ahead.append(pool.submit(self._tensors, epoch, nxt))
                        nxt += 1
                    yield ahead.popleft().result()
            finally:  # the loop was left early: drop what was not started
                for f in ahead:
                    f.cancel()
