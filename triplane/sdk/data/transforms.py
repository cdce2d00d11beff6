"""Batch transforms for images: ``Compose([RandomCrop(8, padding=1), Scale(1 / 16),
Normalize(mean, std)])``.

A transform is a callable ``t(x, rng=None) -> array`` on a whole batch ``x`` of shape
(N, ..., H, W) (channels, if any, on axis 1: NCHW), drawing each sample's random choice
from ``rng``. The DataLoader passes a generator seeded by ``(seed, epoch, batch)``; called
without one, a transform uses its own generator, seeded by its ``seed`` argument (None:
fresh entropy). :class:`Compose` passes the same generator through its transforms in
order. To transform one sample, give it a batch axis: ``t(x[None])[0]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Compose", "Lambda", "Normalize", "RandomCrop", "RandomHorizontalFlip", "Scale", "Transform"]


class Transform:
    """Base class: subclasses define ``apply(x, rng)``."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim < 1:
            raise ValueError(f"{type(self).__name__}: needs a batch (N, ...), got a 0-d array")
        return self.apply(x, self._rng if rng is None else rng)

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Compose(Transform):
    """The transforms in order, sharing one generator."""

    def __init__(self, transforms: Sequence[Callable[..., np.ndarray]], seed: int | None = None) -> None:
        super().__init__(seed)
        self.transforms = list(transforms)

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        for t in self.transforms:
            x = np.asarray(t(x, rng))
        return x


class Lambda(Transform):
    """``fn(x)`` as a transform (deterministic)."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        super().__init__(0)
        self.fn = fn

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.fn(x))


class RandomHorizontalFlip(Transform):
    """Each sample mirrored left-right (its last axis reversed) with probability ``p``."""

    def __init__(self, p: float = 0.5, seed: int | None = None) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p}")
        super().__init__(seed)
        self.p = p

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if x.ndim < 2:
            raise ValueError(f"RandomHorizontalFlip: needs (N, ..., W), got shape {x.shape}")
        flip = rng.random(x.shape[0]) < self.p
        out = x.copy()
        out[flip] = x[flip][..., ::-1]
        return out


class RandomCrop(Transform):
    """A random ``size`` (h, w) window of each sample after padding its last two axes by
    ``padding`` on every side with ``fill`` (the usual "pad 4, crop 32" augmentation)."""

    def __init__(self, size: int | Sequence[int], padding: int = 0, fill: float = 0.0,
                 seed: int | None = None) -> None:
        super().__init__(seed)
        self.size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        if padding < 0 or min(self.size) < 1:
            raise ValueError(f"RandomCrop: need size >= 1 and padding >= 0, got {size}, {padding}")
        self.padding, self.fill = int(padding), fill

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if x.ndim < 3:
            raise ValueError(f"RandomCrop: needs (N, ..., H, W), got shape {x.shape}")
        p, (h, w) = self.padding, self.size
        pad = [(0, 0)] * (x.ndim - 2) + [(p, p), (p, p)]
        xp = np.pad(x, pad, constant_values=self.fill) if p else x
        ph, pw = xp.shape[-2:]
        if h > ph or w > pw:
            raise ValueError(f"RandomCrop: a {self.size} crop of padded images of size {(ph, pw)}")
        tops = rng.integers(0, ph - h + 1, size=x.shape[0])
        lefts = rng.integers(0, pw - w + 1, size=x.shape[0])
        return np.stack([xp[i, ..., t:t + h, s:s + w] for i, (t, s) in enumerate(zip(tops, lefts))])


class Scale(Transform):
    """``x * factor`` as ``dtype`` (float32 by default): e.g. 1/255 for uint8 pixels."""

    def __init__(self, factor: float, dtype: Any = np.float32) -> None:
        super().__init__(0)
        self.factor, self.dtype = factor, np.dtype(dtype)

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (x * self.factor).astype(self.dtype, copy=False)


class Normalize(Transform):
    """``(x - mean) / std`` per channel (axis 1 of NCHW; scalars for all), in x's float
    dtype (float32 if x is not floating)."""

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float]) -> None:
        super().__init__(0)
        self.mean, self.std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
        if np.any(self.std <= 0) or self.mean.ndim > 1 or self.std.ndim > 1:
            raise ValueError(f"Normalize: need std > 0 and scalars or one value per channel, "
                             f"got mean={mean}, std={std}")

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)
        mean, std = self.mean, self.std
        if mean.ndim or std.ndim:
            c = max(mean.size, std.size)
            if x.ndim < 2 or x.shape[1] != c:
                raise ValueError(f"Normalize: {c} channel statistics for a batch of shape {x.shape} "
                                 "(channels on axis 1)")
            shape = (1, c) + (1,) * (x.ndim - 2)
            mean, std = mean.reshape(shape) if mean.ndim else mean, std.reshape(shape) if std.ndim else std
        return ((x - mean) / std).astype(dtype, copy=False)
