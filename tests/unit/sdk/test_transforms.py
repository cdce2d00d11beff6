"""Batch transforms: each against a numpy statement of what it does, seeded and composable."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.sdk.data import transforms as T


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def _images(seed: int, n: int = 64, c: int = 2, h: int = 5, w: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, size=(n, c, h, w))


def test_flip_mirrors_each_sample_or_leaves_it(seed: int) -> None:
    x = _images(seed)
    out = T.RandomHorizontalFlip(0.5)(x, np.random.default_rng(seed))
    flipped = [np.array_equal(o, xi[..., ::-1]) for o, xi in zip(out, x)]
    kept = [np.array_equal(o, xi) for o, xi in zip(out, x)]
    assert all(f != k for f, k in zip(flipped, kept)), f"seed={seed}: a sample is neither kept nor mirrored"
    assert 10 < sum(flipped) < 54, f"seed={seed}: {sum(flipped)} of 64 flipped at p=0.5"
    np.testing.assert_array_equal(T.RandomHorizontalFlip(1.0)(x), x[..., ::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(0.0)(x), x)


def test_crop_takes_a_window_of_the_padded_image(seed: int) -> None:
    x = _images(seed, n=16)
    out = T.RandomCrop((5, 6), padding=2, fill=-1.0)(x, np.random.default_rng(seed))
    assert out.shape == x.shape
    padded = np.pad(x, [(0, 0), (0, 0), (2, 2), (2, 2)], constant_values=-1.0)
    for i in range(len(x)):
        windows = [(t, s) for t in range(5) for s in range(5)
                   if np.array_equal(out[i], padded[i, :, t:t + 5, s:s + 6])]
        assert windows, f"seed={seed}: sample {i} is no window of its padded image"
    np.testing.assert_array_equal(T.RandomCrop((5, 6))(x), x)  # no padding, full size: identity
    small = T.RandomCrop(3)(x[:, 0])  # (N, H, W) works too
    assert small.shape == (16, 3, 3)


def test_scale_and_normalize(seed: int) -> None:
    x = (_images(seed) * 255).astype(np.uint8)
    s = T.Scale(1 / 255)(x)
    assert s.dtype == np.float32
    np.testing.assert_allclose(s, x / 255, rtol=1e-6)
    mean, std = [0.2, 0.6], [0.5, 2.0]
    n = T.Normalize(mean, std)(s)
    want = (s.astype(np.float64) - np.array(mean)[None, :, None, None]) / np.array(std)[None, :, None, None]
    assert n.dtype == np.float32
    np.testing.assert_allclose(n, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(T.Normalize(0.5, 0.25)(x[:, 0].astype(np.float64)),
                               (x[:, 0] - 0.5) / 0.25)
    with pytest.raises(ValueError, match="2 channel statistics for a batch of shape"):
        T.Normalize(mean, std)(np.zeros((4, 3, 2, 2)))
    with pytest.raises(ValueError, match="std > 0"):
        T.Normalize(0.0, 0.0)


def test_compose_is_seeded_and_runs_in_order(seed: int) -> None:
    x = _images(seed)

    def aug(s: int | None = None) -> T.Compose:
        return T.Compose([T.RandomCrop(5, padding=1), T.RandomHorizontalFlip(), T.Scale(2.0),
                          T.Lambda(lambda a: a - 1.0)], seed=s)

    a = aug()(x, np.random.default_rng(seed))
    b = aug()(x, np.random.default_rng(seed))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(aug(seed)(x), aug(seed)(x))  # its own generator, seeded
    assert a.shape == (64, 2, 5, 5) and a.min() >= -1.0 and a.max() <= 1.0
    assert "RandomHorizontalFlip(p=0.5)" in repr(aug())


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"needs \(N, \.\.\., H, W\)"):
        T.RandomCrop(2)(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="p must be in"):
        T.RandomHorizontalFlip(2.0)
    with pytest.raises(ValueError, match="crop of padded images"):
        T.RandomCrop(9)(np.zeros((1, 4, 4)))
