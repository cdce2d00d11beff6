"""Small bundled data sets. Nothing here downloads.

:func:`digits` reads scikit-learn's bundled copy of the UCI handwritten digits and
raises ``ImportError`` with the install command when scikit-learn is missing; a
deterministic synthetic stand-in is there only on request (``synthetic=True``), for
tests that must not depend on scikit-learn.
"""

from __future__ import annotations

import numpy as np

__all__ = ["digits"]

INSTALL_HINT = ("datasets.digits() reads scikit-learn's bundled copy of the digits: "
                "python3 -m pip install scikit-learn (or triplane[dev]); "
                "datasets.digits(synthetic=True) gives a synthetic stand-in instead")

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


def digits(n: int | None = None, seed: int = 0, synthetic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """8x8 grey images of digits (values 0..16, float32, shape (n, 8, 8)) and int64 labels.

    scikit-learn's 1797 images (the first ``n`` if given); ``ImportError`` naming the
    install command if scikit-learn is missing. ``synthetic=True``: ``n`` (default 1797)
    seven-segment digits with jitter and noise, a pure function of ``seed``.
    """
    if synthetic:
        return _synthetic_digits(1797 if n is None else n, seed)
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-not-found]
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    d = load_digits()
    x, y = d.images.astype(np.float32), d.target.astype(np.int64)
    return (x[:n], y[:n]) if n is not None else (x, y)
