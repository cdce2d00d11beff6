"""matmul: numpy's semantics in every operand form, every dtype, gradients, and errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import triplane as tp
from triplane.proto.errors import DTypeError, ShapeError
from triplane.sdk.tensor import Tensor, apply
from triplane.testing import assert_close, check_grad, random_array

SHAPES: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
    ((4,), (4, 3)),           # vector @ matrix
    ((3, 4), (4,)),           # matrix @ vector
    ((5,), (5,)),             # dot product: 0-d result
    ((3, 4), (4, 2)),
    ((2, 1, 3, 4), (5, 4, 2)),  # batch dims broadcast: (2, 5, 3, 2)
    ((2, 3, 4), (4,)),        # batched matrix @ vector
    ((4,), (2, 4, 3)),        # vector @ batched matrix
    ((3, 0), (0, 2)),         # k = 0: a (3, 2) of zeros
    ((0, 3), (3, 2)),         # empty result
    ((2, 0, 3), (3, 1)),
]
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "uint8"]


@pytest.mark.parametrize("xs,ys", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_matches_numpy(xs: tuple[int, ...], ys: tuple[int, ...], dtype: str,
                              rng: np.random.Generator, seed: int) -> None:
    x, y = random_array(rng, xs, dtype, -3, 3), random_array(rng, ys, dtype, -3, 3)
    got = tp.matmul(Tensor.from_array(x), Tensor.from_array(y)).numpy()
    what = f"{xs} @ {ys} {dtype} seed={seed}"
    assert got.dtype == x.dtype, what
    if x.dtype.kind in "iu":
        # fixed-width integers wrap: exact in int64, then wrapped to the dtype
        want = np.matmul(x.astype(np.int64), y.astype(np.int64)).astype(dtype)
        assert_close(got, want, what=what)
    else:
        want = np.matmul(x.astype(np.float64), y.astype(np.float64))
        # low-precision dtypes: results up to k*9 in size, so the absolute error scales too
        assert_close(got, want, dtype, atol={"float16": 2e-2, "bfloat16": 2e-1}.get(dtype), what=what)


def test_k_zero_gives_zeros() -> None:
    got = (Tensor.from_array(np.zeros((3, 0))) @ Tensor.from_array(np.zeros((0, 2)))).numpy()
    np.testing.assert_array_equal(got, np.zeros((3, 2)))


def test_operator_promotes_dtypes(rng: np.random.Generator) -> None:
    # numpy's promotion: int8 with float32 meets at float32, int64 with float32 at float64
    x, y = rng.integers(-3, 4, (2, 3)).astype(np.int8), rng.standard_normal((3, 2)).astype(np.float32)
    z = Tensor.from_array(x) @ Tensor.from_array(y)
    assert z.dtype == tp.float32
    assert_close(z.numpy(), x.astype(np.float64) @ y.astype(np.float64), "float32", atol=1e-5)
    assert (Tensor.from_array(x.astype(np.int64)) @ Tensor.from_array(y)).dtype == tp.float64


@pytest.mark.parametrize("xs,ys", SHAPES)
def test_matmul_gradients(xs: tuple[int, ...], ys: tuple[int, ...], rng: np.random.Generator,
                          seed: int) -> None:
    try:
        check_grad(lambda a, b: a @ b, [rng.standard_normal(xs), rng.standard_normal(ys)], seed=seed)
    except AssertionError as e:
        raise AssertionError(f"{xs} @ {ys} seed={seed}: {e}") from None


def test_second_order_matmul_gradient(rng: np.random.Generator, seed: int) -> None:
    x, w = rng.standard_normal((2, 3)), rng.standard_normal((3, 2))
    check_grad(lambda a, b: tp.grad(((a @ b) * (a @ b)).sum(), [a])[0], [x, w], seed=seed)


@pytest.mark.parametrize("xs,ys,why", [
    ((3, 4), (5, 2), "inner dimensions differ"),
    ((4,), (3,), "inner dimensions differ"),
    ((2, 3, 4), (3, 4, 5), "batch dimensions do not broadcast"),
    ((), (3,), "at least 1 dimension"),
])
def test_shape_errors_name_both_shapes(xs: tuple[int, ...], ys: tuple[int, ...], why: str) -> None:
    x, y = Tensor.from_array(np.zeros(xs, np.float32)), Tensor.from_array(np.zeros(ys, np.float32))
    with pytest.raises(ShapeError, match=rf"matmul.*{why}.*{re.escape(str(xs))} @ {re.escape(str(ys))}"):
        x @ y


def test_ir_matmul_needs_one_dtype() -> None:
    x, y = Tensor.from_array(np.zeros((2, 2), np.float32)), Tensor.from_array(np.zeros((2, 2)))
    with pytest.raises(DTypeError, match="float32 and float64"):
        apply("matmul", [x, y])
    with pytest.raises(DTypeError, match="bool"):
        apply("matmul", [Tensor.from_array(np.ones((2, 2), bool))] * 2)


_dims = st.lists(st.integers(0, 3), min_size=1, max_size=4).map(tuple)


@given(xs=_dims, ys=_dims)
def test_matmul_shapes_agree_with_numpy(xs: tuple[int, ...], ys: tuple[int, ...]) -> None:
    x, y = Tensor.from_array(np.zeros(xs, np.float32)), Tensor.from_array(np.zeros(ys, np.float32))
    try:
        want = np.matmul(np.zeros(xs), np.zeros(ys)).shape
    except ValueError:
        with pytest.raises(ShapeError):
            tp.matmul(x, y)
        return
    assert tp.matmul(x, y).shape == want


@given(batch=st.lists(st.integers(1, 3), max_size=2).map(tuple), m=st.integers(1, 3),
       k=st.integers(1, 3), n=st.integers(1, 3))
def test_matching_shapes_always_infer(batch: tuple[int, ...], m: int, k: int, n: int) -> None:
    # the other half of the property: shapes that do fit never raise, whatever the batch
    x = Tensor.from_array(np.zeros((*batch, m, k), np.float32))
    y = Tensor.from_array(np.zeros((1,) * len(batch) + (k, n), np.float32))
    assert tp.matmul(x, y).shape == (*batch, m, n)
