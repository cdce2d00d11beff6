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


# Elements are made in chunks of _CHUNK with in-place ufuncs: the same arithmetic as the
# contract's formulas (so the same bits), without a tensor-sized temporary per step; about
# 4x faster than whole-array expressions for a 4096x4096 normal tensor.
_CHUNK = 1 << 16
_RAMP = np.arange(_CHUNK, dtype=np.uint64)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _key(seed: int) -> np.uint64:
    with np.errstate(over="ignore"):
        return _mix(np.array([seed & _MASK], dtype=np.uint64))[0]


def _bits_into(z: np.ndarray, key: np.uint64, tmp: np.ndarray) -> None:
    """``z`` (element indices, uint64) becomes ``bits(seed, z)`` in place."""
    with np.errstate(over="ignore"):
        np.multiply(z, _GOLDEN, out=z)
        np.add(z, key, out=z)
        for shift, mult in ((30, _M1), (27, _M2), (31, None)):
            np.right_shift(z, np.uint64(shift), out=tmp)
            np.bitwise_xor(z, tmp, out=z)
            if mult is not None:
                np.multiply(z, mult, out=z)


def _uniform_into(out: np.ndarray, z: np.ndarray, key: np.uint64, tmp: np.ndarray) -> None:
    """``out`` (float64) = uniform for the indices ``z`` (clobbered)."""
    _bits_into(z, key, tmp)
    np.right_shift(z, np.uint64(11), out=z)
    np.multiply(z, 2.0**-53, out=out)  # < 2**53: the cast to float64 is exact


def _normal_into(out: np.ndarray, index: np.ndarray, seed: int, z: np.ndarray, tmp: np.ndarray,
                 u2: np.ndarray) -> None:
    """``out`` (float64) = standard normal for the indices ``index`` (left intact)."""
    np.copyto(z, index)
    _uniform_into(out, z, _key(seed), tmp)
    np.copyto(z, index)
    _uniform_into(u2, z, _key(seed ^ _STREAM2), tmp)
    np.negative(out, out=out)
    np.log1p(out, out=out)
    np.multiply(out, -2.0, out=out)
    np.sqrt(out, out=out)
    np.multiply(u2, 2.0 * np.pi, out=u2)
    np.cos(u2, out=u2)
    np.multiply(out, u2, out=out)


def _chunks(index: np.ndarray):
    """(flat output slice, flat uint64 indices) of ``index`` (any shape) in chunks."""
    flat_rows = index.reshape(index.shape[0], -1) if index.ndim > 1 else index.reshape(-1, 1)
    row = flat_rows.shape[1]
    rows = max(1, _CHUNK // max(1, row))
    for r in range(0, flat_rows.shape[0], rows):
        block = flat_rows[r:r + rows]
        yield slice(r * row, r * row + block.size), block.reshape(-1)


def _draw(seed: int, index: np.ndarray, normal: bool) -> np.ndarray:
    out = np.empty(index.size, dtype=np.float64)
    for where, idx in _chunks(index):
        n = idx.size
        z, tmp = np.empty(n, np.uint64), np.empty(n, np.uint64)
        if normal:
            _normal_into(out[where], idx, seed, z, tmp, np.empty(n, np.float64))
        else:
            np.copyto(z, idx)
            _uniform_into(out[where], z, _key(seed), tmp)
    return out.reshape(index.shape)


def _run(start: int, count: int) -> np.ndarray:
    """The indices ``start .. start + count`` as an (unmaterialised where possible) array."""
    if count <= _CHUNK:
        return _RAMP[:count] + np.uint64(start)
    return np.arange(start, start + count, dtype=np.uint64)


def random_bits(seed: int, start: int, count: int) -> np.ndarray:
    """``bits(seed, i)`` for ``i`` in ``[start, start + count)``, as uint64."""
    return bits_at(seed, np.arange(start, start + count, dtype=np.uint64))


def uniform01(seed: int, size: int, start: int = 0) -> np.ndarray:
    """float64 uniform numbers in [0, 1) for elements ``start .. start + size``."""
    return _draw(seed, _run(start, size), normal=False)


def standard_normal(seed: int, size: int, start: int = 0) -> np.ndarray:
    """float64 standard normal numbers for elements ``start .. start + size``."""
    return _draw(seed, _run(start, size), normal=True)


# --- arbitrary element indices (tiles of a random tensor) --------------------------------


def bits_at(seed: int, index: np.ndarray) -> np.ndarray:
    """``bits(seed, i)`` for every ``i`` of ``index`` (any shape, uint64-convertible)."""
    z = np.array(index, dtype=np.uint64)  # a copy: made into the bits in place
    _bits_into(z, _key(seed), np.empty_like(z))
    return z


def uniform01_at(seed: int, index: np.ndarray) -> np.ndarray:
    """float64 uniform numbers in [0, 1) for the elements ``index``."""
    return _draw(seed, np.asarray(index, dtype=np.uint64), normal=False)


def standard_normal_at(seed: int, index: np.ndarray) -> np.ndarray:
    """float64 standard normal numbers for the elements ``index``."""
    return _draw(seed, np.asarray(index, dtype=np.uint64), normal=True)


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
