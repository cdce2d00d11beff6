"""The counter-based random numbers every engine must reproduce bit for bit.

Element ``i`` (row-major index) of a random tensor with seed ``s`` is a function of
``(s, i)`` alone, so any tile of it can be made on any node, and a GPU or vendor engine
makes the same values. The contract (docs/concepts.md, "Random numbers"):

    mix(z)      = splitmix64's finaliser on uint64 (wrapping arithmetic)
    bits(s, i)  = mix(i * 0x9E3779B97F4A7C15 + mix(s))          (uint64)
    uniform     = (bits >> 11) * 2**-53              in [0, 1), then low + (high - low) * u
    normal      = sqrt(-2 ln(1 - u1)) * cos(2 pi u2) with u1 from bits(s, i) and
                  u2 from bits(s ^ 0x5851F42D4C957F2D, i); then mean + std * z
computed in float64 and rounded to the tensor's dtype.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STREAM2 = 0x5851F42D4C957F2D
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def random_bits(seed: int, start: int, count: int) -> np.ndarray:
    """``bits(seed, i)`` for ``i`` in ``[start, start + count)``, as uint64."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & _MASK], dtype=np.uint64))[0]
        idx = np.arange(start, start + count, dtype=np.uint64)
        return _mix(idx * _GOLDEN + key)


def uniform01(seed: int, size: int, start: int = 0) -> np.ndarray:
    """float64 uniform numbers in [0, 1) for elements ``start .. start + size``."""
    return (random_bits(seed, start, size) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def standard_normal(seed: int, size: int, start: int = 0) -> np.ndarray:
    """float64 standard normal numbers for elements ``start .. start + size``."""
    u1 = uniform01(seed, size, start)
    u2 = uniform01(seed ^ _STREAM2, size, start)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


# --- arbitrary element indices (tiles of a random tensor) --------------------------------


def bits_at(seed: int, index: np.ndarray) -> np.ndarray:
    """``bits(seed, i)`` for every ``i`` of ``index`` (any shape, uint64-convertible)."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & _MASK], dtype=np.uint64))[0]
        return _mix(np.asarray(index, dtype=np.uint64) * _GOLDEN + key)


def uniform01_at(seed: int, index: np.ndarray) -> np.ndarray:
    """float64 uniform numbers in [0, 1) for the elements ``index``."""
    return (bits_at(seed, index) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def standard_normal_at(seed: int, index: np.ndarray) -> np.ndarray:
    """float64 standard normal numbers for the elements ``index``."""
    u1 = uniform01_at(seed, index)
    u2 = uniform01_at(seed ^ _STREAM2, index)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def region_index(shape: tuple[int, ...], full_shape: tuple[int, ...] | None,
                 start: tuple[int, ...] | None, offset: int = 0) -> np.ndarray | tuple[int, int]:
    """The row-major element indices (plus ``offset``) of the box ``start .. start + shape``
    of a tensor of ``full_shape``, as an array of ``shape``; or ``(first, count)`` when the
    box is one contiguous run (the whole tensor, or whole trailing dims), the fast case."""
    size = int(np.prod(shape, dtype=np.int64))
    if full_shape is None or start is None:
        return offset, size
    strides = [1] * len(full_shape)
    for d in range(len(full_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * full_shape[d + 1]
    first = offset + sum(s * st for s, st in zip(start, strides))
    # Contiguous when every dim after the first one that is cut (narrower than full) is
    # whole and all dims before it have extent 1.
    cut = [d for d in range(len(shape)) if shape[d] != full_shape[d]]
    if not cut or (all(shape[d] == full_shape[d] for d in range(cut[0] + 1, len(shape)))
                   and all(shape[d] == 1 for d in range(cut[0]))):
        return first, size
    index = np.full((), first, dtype=np.uint64)
    for d, (n, st) in enumerate(zip(shape, strides)):
        axis = np.arange(n, dtype=np.uint64) * np.uint64(st)
        index = index + axis.reshape((1,) * d + (n,) + (1,) * (len(shape) - d - 1))
    return np.broadcast_to(index, shape)
