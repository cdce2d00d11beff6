"""Shape ops and indexing: values against numpy, gradients against finite differences,
inference against numpy (hypothesis), and clear errors for bad shapes, axes and indices."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import triplane as tp
from triplane.proto.errors import DTypeError, KernelError, ShapeError
from triplane.sdk.shape import TensorIndexError
from triplane.sdk.tensor import Tensor, apply
from triplane.testing import assert_close, check_grad, random_array

DTYPES = ["float32", "bfloat16", "float64", "int32", "uint8", "bool"]




def T(a: Any) -> Tensor:
    return Tensor.from_array(np.asarray(a))


# (name, triplane function, numpy reference, input shapes): moves of elements are exact, so
# every dtype is compared exactly.
CASES: list[tuple[str, Callable[..., Tensor], Callable[..., np.ndarray], list[tuple[int, ...]]]] = [
    ("reshape-1", lambda x: tp.reshape(x, (-1, 2)), lambda x: x.reshape(-1, 2), [(3, 4)]),
    ("reshape0d", lambda x: tp.reshape(x, (1, 1)), lambda x: x.reshape(1, 1), [()]),
    ("reshape-empty", lambda x: tp.reshape(x, (3, -1)), lambda x: x.reshape(3, -1), [(0, 3)]),
    ("flatten", lambda x: x.flatten(), lambda x: x.reshape(-1), [(2, 3, 2)]),
    ("transpose", lambda x: tp.transpose(x), lambda x: x.T, [(2, 3, 4)]),
    ("transpose-perm", lambda x: tp.transpose(x, (1, -1, 0)), lambda x: x.transpose(1, 2, 0), [(2, 3, 4)]),
    ("permute", lambda x: x.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1), [(2, 3, 4)]),
    ("T-empty", lambda x: x.T, lambda x: x.T, [(0, 3)]),
    ("broadcast_to", lambda x: tp.broadcast_to(x, (2, 3, 4)), lambda x: np.broadcast_to(x, (2, 3, 4)),
     [(3, 1)]),
    ("squeeze", lambda x: tp.squeeze(x), lambda x: np.squeeze(x), [(1, 3, 1, 2)]),
    ("squeeze-axis", lambda x: x.squeeze(-2), lambda x: np.squeeze(x, -2), [(1, 3, 1, 2)]),
    ("unsqueeze", lambda x: x.unsqueeze(1), lambda x: np.expand_dims(x, 1), [(2, 3)]),
    ("unsqueeze-many", lambda x: tp.unsqueeze(x, (0, -1)), lambda x: np.expand_dims(x, (0, -1)), [(2, 3)]),
    ("expand_dims0d", lambda x: tp.expand_dims(x, 0), lambda x: np.expand_dims(x, 0), [()]),
    ("concat", lambda a, b: tp.concat([a, b], 1), lambda a, b: np.concatenate([a, b], 1),
     [(2, 3), (2, 4)]),
    ("concat-neg-empty", lambda a, b, c: tp.concatenate([a, b, c], -1),
     lambda a, b, c: np.concatenate([a, b, c], -1), [(2, 0), (2, 2), (2, 1)]),
    ("stack", lambda a, b: tp.stack([a, b], 1), lambda a, b: np.stack([a, b], 1), [(2, 3), (2, 3)]),
    ("stack-end", lambda a, b: tp.stack([a, b], -1), lambda a, b: np.stack([a, b], -1), [(3,), (3,)]),
    ("stack0d", lambda a, b: tp.stack([a, b]), lambda a, b: np.stack([a, b]), [(), ()]),
    ("flip", lambda x: tp.flip(x), lambda x: np.flip(x), [(2, 3, 4)]),
    ("flip-axes", lambda x: x.flip((0, -1)), lambda x: np.flip(x, (0, -1)), [(2, 3, 4)]),
    ("flip0d", lambda x: tp.flip(x), lambda x: np.flip(x), [()]),
    ("pad", lambda x: tp.pad(x, ((1, 0), (2, 3))), lambda x: np.pad(x, ((1, 0), (2, 3))), [(2, 3)]),
    ("pad-int", lambda x: tp.pad(x, 1, value=1), lambda x: np.pad(x, 1, constant_values=1), [(2, 0, 3)]),
    ("slice", lambda x: tp.slice(x, [1, -1], [3, 0], [1, -2]), lambda x: x[1:3, -1:0:-2], [(4, 6)]),
    ("slice-axes", lambda x: tp.slice(x, [-2], [100], axes=[1]), lambda x: x[:, -2:100], [(2, 5)]),
    ("gather", lambda x: tp.gather(x, [[2, 0], [1, -1]], axis=1),
     lambda x: np.take(x, [[2, 0], [1, -1]], axis=1), [(2, 3, 4)]),
    ("gather-0d-index", lambda x: tp.gather(x, np.int64(1), axis=0), lambda x: x[1], [(3, 2)]),
    ("index_select", lambda x: tp.index_select(x, -1, [3, 3, 0]), lambda x: x[..., [3, 3, 0]],
     [(2, 4)]),
]


@pytest.mark.parametrize("name,fn,ref,shapes", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_ops_match_numpy(name: str, fn: Callable[..., Tensor], ref: Callable[..., np.ndarray],
                               shapes: list[tuple[int, ...]], dtype: str, rng: np.random.Generator,
                               seed: int) -> None:
    xs = [np.asarray(random_array(rng, s, dtype, -9, 9)) for s in shapes]
    got = fn(*[T(x) for x in xs])
    want = ref(*xs)
    assert got.shape == want.shape, f"{name} {dtype}: inferred {got.shape}, numpy {want.shape}"
    assert got.dtype.name == dtype
    assert_close(got.numpy(), want, "int64" if dtype != "bool" else "bool",
                 what=f"{name} {dtype} seed={seed}")  # exact: elements only move


def test_split(rng: np.random.Generator) -> None:
    x = rng.standard_normal((6, 4))
    for got, want in zip(tp.split(T(x), 3), np.split(x, 3)):
        np.testing.assert_array_equal(got.numpy(), want)
    pieces = tp.split(T(x), [1, 0, 3], axis=-1)
    assert [p.shape for p in pieces] == [(6, 1), (6, 0), (6, 3)]
    np.testing.assert_array_equal(pieces[2].numpy(), x[:, 1:])
    with pytest.raises(ShapeError, match=r"split.*4 equal pieces"):
        tp.split(T(x), 4)
    with pytest.raises(ShapeError, match=r"split.*\[1, 2\] do not add up to 4"):
        tp.split(T(x), [1, 2], axis=1)


# --- indexing ---------------------------------------------------------------------------------

INDICES: list[Any] = [
    0, -1, (1, 2), (slice(1, 3), slice(None, None, 2)), (..., None), (None, 0, ..., 1),
    (slice(None, None, -1),), (slice(-1, 0, -2), 1, slice(3, 1, -1)), (..., [1, 0, 1]),
    ([2, 0],), (1, [0, 3], slice(None)), (0, slice(None), [1, 1]), (slice(5, 9),), (Ellipsis,),
    (slice(None), None, [[1, 0], [2, 2]]), (np.array([-1, 0]), 0),
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
def test_getitem_matches_numpy(index: Any, rng: np.random.Generator, seed: int) -> None:
    x = rng.standard_normal((3, 4, 5))
    got = T(x)[index]
    want = x[index]
    assert got.shape == want.shape, f"x{index!r}: {got.shape} vs numpy {want.shape}"
    np.testing.assert_array_equal(got.numpy(), want, err_msg=f"seed={seed}")


def test_getitem_with_a_tensor_index_and_iteration(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 3))
    idx = T(np.array([3, 1, 1]))
    np.testing.assert_array_equal(T(x)[idx].numpy(), x[[3, 1, 1]])
    np.testing.assert_array_equal(T(x)[:, T(np.array([-1]))].numpy(), x[:, [-1]])
    rows = list(T(x))  # iteration stops at IndexError, like a list
    assert len(rows) == 4
    np.testing.assert_array_equal(rows[2].numpy(), x[2])


def test_getitem_records_explicit_nodes() -> None:
    x = T(np.zeros((4, 6)))
    y = x[1:3, ::-2]
    assert y.op == "flip"
    s = y._inputs[0]
    assert s.op == "slice" and s._attrs["starts"] == (1, 1) and s._attrs["stops"] == (3, 6) \
        and s._attrs["steps"] == (1, 2)
    assert x[...] is x and x[:, :] is x


@pytest.mark.parametrize("index,match", [
    (4, r"index 4 is out of range for axis 0 of size 4 \(shape \(4, 3\)\)"),
    ((0, -4), r"index -4 is out of range for axis 1 of size 3"),
    ((0, 0, 0), r"too many indices \(3\) for shape \(4, 3\)"),
    ([0, 9], r"index 9 is out of range for axis 0 of size 4"),
    (([0], [1]), "only one integer-array index"),
    (np.array([True, False, True, True]), "boolean mask"),
    ("a", "unsupported index"),
    ((..., ...), "one ellipsis"),
])
def test_bad_indices_raise_at_record_time(index: Any, match: str) -> None:
    x = T(np.zeros((4, 3)))
    with pytest.raises(TensorIndexError, match=match):
        x[index]
    assert issubclass(TensorIndexError, IndexError) and issubclass(TensorIndexError, ShapeError)


def test_gather_out_of_range_at_run_time_is_a_kernel_error() -> None:
    x = T(np.arange(6.0).reshape(2, 3))
    idx = T(np.array([0, 3])) + 0  # computed, so unknown when recorded
    y = tp.gather(x, idx, axis=1)
    assert y.shape == (2, 2)
    with pytest.raises(KernelError, match=r"gather.*index 3 is out of range for an axis of size 3"):
        y.numpy()


# --- gradients --------------------------------------------------------------------------------

GRADS: list[tuple[str, Callable[..., Tensor], list[tuple[int, ...]]]] = [
    ("reshape", lambda x: tp.reshape(x, (4, -1)), [(2, 3, 2)]),
    ("transpose", lambda x: tp.transpose(x, (2, 0, 1)), [(2, 3, 2)]),
    ("broadcast_to", lambda x: tp.broadcast_to(x, (2, 3, 4)), [(3, 1)]),
    ("squeeze", lambda x: tp.squeeze(x), [(1, 3, 1)]),
    ("unsqueeze", lambda x: tp.unsqueeze(x, (0, 2)), [(2, 3)]),
    ("concat", lambda a, b, c: tp.concat([a, b, c], 1), [(2, 1), (2, 3), (2, 2)]),
    ("stack", lambda a, b: tp.stack([a, b], -1), [(2, 3), (2, 3)]),
    ("slice-steps", lambda x: x[1::2, ::3], [(5, 7)]),
    ("slice-negative-steps", lambda x: x[::-2, 5:0:-3], [(5, 7)]),
    ("int-index", lambda x: x[1, ..., None, -1], [(3, 2, 4)]),
    ("gather-repeated", lambda x: tp.gather(x, [[0, 2, 0], [2, 2, 1]], axis=1), [(2, 3, 2)]),
    ("getitem-array", lambda x: x[:, [1, 1, -1]], [(2, 3)]),
    ("pad", lambda x: tp.pad(x, ((1, 2), (0, 1)), value=3.0), [(2, 3)]),
    ("flip", lambda x: tp.flip(x, 1), [(2, 3, 2)]),
    ("split", lambda x: tp.split(x, [1, 3], axis=1)[1] * tp.split(x, 2, axis=1)[0].sum(), [(2, 4)]),
    ("empty-slice", lambda x: tp.concat([x[1:1], x], 0), [(3, 2)]),
]


@pytest.mark.parametrize("name,fn,shapes", GRADS, ids=[g[0] for g in GRADS])
def test_shape_gradients(name: str, fn: Callable[..., Tensor], shapes: list[tuple[int, ...]],
                         rng: np.random.Generator, seed: int) -> None:
    try:
        check_grad(fn, [rng.standard_normal(s) for s in shapes], seed=seed)
    except AssertionError as e:
        raise AssertionError(f"{name} seed={seed}: {e}") from None


def test_second_order_through_gather_and_slice(rng: np.random.Generator, seed: int) -> None:
    # the gradients of gather (scatter_add) and slice (unslice) are differentiable again
    x = rng.standard_normal((4, 3))
    check_grad(lambda t: tp.grad((tp.gather(t, [0, 0, 3]) ** 2).sum(), [t])[0], [x], seed=seed)
    check_grad(lambda t: tp.grad((t[::2, 1:] ** 3).sum(), [t])[0], [x], seed=seed)


def test_gather_gradient_sums_repeated_indices() -> None:
    x = T(np.zeros((3, 2)))
    (g,) = tp.grad(tp.gather(x, [2, 0, 2, 2]).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [[1, 1], [0, 0], [3, 3]])


# --- errors -----------------------------------------------------------------------------------


def test_bad_shapes_raise_clear_errors() -> None:
    x = T(np.zeros((2, 3), np.float32))
    cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: tp.reshape(x, (4, 2)), ShapeError, r"reshape.*\(2, 3\).*\(4, 2\)"),
        (lambda: tp.reshape(x, (4, -1)), ShapeError, r"reshape.*\(2, 3\).*\[4, -1\]"),
        (lambda: tp.reshape(x, (-1, -1)), ShapeError, r"reshape.*only one dimension"),
        (lambda: tp.transpose(x, (0, 0)), ShapeError, r"transpose.*perm \[0, 0\].*\(2, 3\)"),
        (lambda: tp.transpose(x, (0, 2)), ShapeError, r"transpose.*perm \[0, 2\].*\(2, 3\)"),
        (lambda: tp.transpose(x, (0,)), ShapeError, r"transpose.*perm \[0\]"),
        (lambda: tp.squeeze(x, 0), ShapeError, r"squeeze.*axis 0 of shape \(2, 3\).*size is 2"),
        (lambda: tp.unsqueeze(x, 3), ShapeError, r"unsqueeze.*axis 3 is out of range"),
        (lambda: tp.flip(x, 2), ShapeError, r"flip.*axis 2 is out of range.*\(2, 3\)"),
        (lambda: tp.concat([x, T(np.zeros((3, 3), np.float32))], 1), ShapeError,
         r"concat.*\(2, 3\), \(3, 3\) differ outside axis 1"),
        (lambda: tp.concat([x, T(np.zeros(3, np.float32))]), ShapeError, r"concat.*\(2, 3\), \(3,\)"),
        (lambda: tp.concat([x, x], 2), ShapeError, r"concat.*axis 2 is out of range"),
        (lambda: tp.stack([x, x.T]), ShapeError, r"stack.*\(2, 3\), \(3, 2\)"),
        (lambda: tp.gather(x, np.array([0.0, 1.0])), DTypeError, r"gather.*float64.*\(2,\)"),
        (lambda: apply("gather", [x, T(np.array([0.5]))]), DTypeError, r"gather.*float64"),
        (lambda: tp.gather(x, [0], axis=2), ShapeError, r"gather.*axis 2 is out of range"),
        (lambda: tp.index_select(x, 0, [[0]]), ShapeError, r"index_select.*1-d.*\(1, 1\)"),
        (lambda: tp.pad(x, ((1, 1),) * 3), ShapeError, r"pad.*does not fit shape \(2, 3\)"),
        (lambda: tp.pad(x, -1), ShapeError, r"pad.*non-negative"),
        (lambda: tp.broadcast_to(x, (3, 3)), ShapeError, r"broadcast_to.*\(2, 3\) to \(3, 3\)"),
        (lambda: apply("slice", [x], starts=[0, 0], stops=[3, 3], steps=[1, 1]), ShapeError,
         r"slice.*axis 0: slice 0:3:1.*\(2, 3\)"),
        (lambda: apply("slice", [x], starts=[0], stops=[1], steps=[1]), ShapeError,
         r"slice.*one entry per axis of \(2, 3\)"),
        (lambda: tp.slice(x, [0], [1], [0]), ShapeError, r"slice.*step cannot be zero"),
        (lambda: apply("pad", [x], pads=[[1, -1], [0, 0]]), Exception, r"pad.*pairs of non-negative"),
    ]
    for fn, kind, match in cases:
        with pytest.raises(kind, match=match):
            fn()


# --- inference agrees with numpy (hypothesis) ---------------------------------------------------

_shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)


@given(shape=_shapes, target=st.lists(st.integers(-1, 6), max_size=4))
def test_reshape_agrees_with_numpy(shape: tuple[int, ...], target: list[int]) -> None:
    x = T(np.zeros(shape, np.float32))
    try:
        want = np.zeros(shape).reshape(target).shape
    except ValueError:
        with pytest.raises(ShapeError):
            tp.reshape(x, target)
        return
    assert tp.reshape(x, target).shape == want


@given(shape=_shapes, perm=st.lists(st.integers(-5, 5), max_size=5))
def test_transpose_agrees_with_numpy(shape: tuple[int, ...], perm: list[int]) -> None:
    x = T(np.zeros(shape, np.float32))
    try:
        want = np.zeros(shape).transpose(perm).shape
    except ValueError:
        with pytest.raises(ShapeError, match=re.escape(str(shape))):
            tp.transpose(x, perm)
        return
    assert tp.transpose(x, perm).shape == want


_bound = st.none() | st.integers(-7, 7)
_item = (st.integers(-6, 6) | st.none() | st.just(Ellipsis)
         | st.builds(slice, _bound, _bound, st.none() | st.integers(-3, 3).filter(bool)))


@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple),
       index=st.lists(_item, max_size=4).map(tuple))
def test_getitem_agrees_with_numpy(shape: tuple[int, ...], index: tuple[Any, ...]) -> None:
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    try:
        want = data[index]
    except IndexError:
        with pytest.raises(TensorIndexError):
            T(data)[index]
        return
    got = T(data)[index]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want)


def test_shape_functions_take_torch_spellings() -> None:
    x = np.arange(24.0).reshape(2, 1, 3, 4)
    t = tp.tensor(x)
    np.testing.assert_array_equal(t.squeeze(dim=1).numpy(), x.squeeze(1))
    np.testing.assert_array_equal(tp.unsqueeze(t, dim=0).numpy(), x[None])
    np.testing.assert_array_equal(t.unsqueeze(dim=-1).numpy(), x[..., None])
    np.testing.assert_array_equal(tp.concat([t, t], dim=2).numpy(), np.concatenate([x, x], axis=2))
    np.testing.assert_array_equal(tp.stack([t, t], dim=1).numpy(), np.stack([x, x], axis=1))
    np.testing.assert_array_equal(tp.split(t, 2, dim=3)[1].numpy(), np.split(x, 2, axis=3)[1])
    np.testing.assert_array_equal(t.flip(dims=(0, 3)).numpy(), np.flip(x, (0, 3)))
    with pytest.raises(TypeError, match=r"concat\(\) got both axis= and dim="):
        tp.concat([t, t], axis=0, dim=0)
    with pytest.raises(TypeError, match="position of the new axis"):
        tp.unsqueeze(t)
