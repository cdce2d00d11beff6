"""The promotion rules of proto/dtypes.py are numpy 2's (NEP 50), checked against numpy
itself for every pair of dtypes numpy has; bfloat16 goes as float16 would."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from triplane.proto import dtypes as dt
from triplane.proto.errors import DTypeError

NUMPY_KNOWN = [d for d in dt.ALL if d.name != "bfloat16"]


@pytest.mark.parametrize(("a", "b"), list(itertools.product(NUMPY_KNOWN, NUMPY_KNOWN)))
def test_promote_is_numpys(a: dt.DType, b: dt.DType) -> None:
    assert dt.promote(a, b).np == np.promote_types(a.np, b.np)
    assert dt.result_type(a, b) == dt.promote(a, b)


@pytest.mark.parametrize("d", NUMPY_KNOWN)
@pytest.mark.parametrize("value", [True, 1, 0.5])
def test_python_scalars_are_weak_as_in_numpy(d: dt.DType, value: bool | int | float) -> None:
    want = (np.zeros(2, d.np) + value).dtype
    assert dt.result_type(d, type(value)).np == want
    assert dt.result_type(type(value), d).np == want


@pytest.mark.parametrize("d", NUMPY_KNOWN)
def test_float_functions_and_division_take_numpys_dtypes(d: dt.DType) -> None:
    x = np.ones(2, d.np)
    assert dt.float_of(d).np == np.exp(x).dtype
    assert dt.true_divide_type(d).np == (x / x).dtype
    want_sum = np.sum(x).dtype
    assert dt.sum_type(d).np == (np.dtype(np.int64) if want_sum == np.uint64 else want_sum)


def test_bfloat16_goes_as_float16() -> None:
    for other in NUMPY_KNOWN:
        half = dt.promote(dt.float16, other)
        want = dt.float32 if other == dt.float16 else dt.bfloat16 if half == dt.float16 else half
        assert dt.promote(dt.bfloat16, other) == want == dt.promote(other, dt.bfloat16)
    assert dt.float_of(dt.bfloat16) == dt.bfloat16


def test_only_python_scalars() -> None:
    assert dt.result_type(int, float) == dt.float64
    assert dt.result_type(int, bool) == dt.int64
    assert dt.result_type(bool) == dt.bool_
    with pytest.raises(DTypeError, match="cannot promote"):
        dt.result_type(dt.int8, complex)


def test_fits() -> None:
    assert dt.fits(255, dt.uint8) and not dt.fits(256, dt.uint8) and not dt.fits(-1, dt.uint8)
    assert dt.fits(-128, dt.int8) and not dt.fits(2**63, dt.int64) and dt.fits(2**70, dt.float16)
