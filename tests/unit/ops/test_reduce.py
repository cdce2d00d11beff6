"""Reductions: values against float64 numpy, gradients against finite differences,
shape inference against numpy (hypothesis), and the errors of bad axes and empty sets."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import triplane as tp
from triplane.proto import optable
from triplane.proto.errors import DTypeError, GraphError, ShapeError
from triplane.sdk.tensor import Tensor, apply
from triplane.testing import TOLERANCE, assert_close, check_grad, random_array


def _lse(x: np.ndarray, axis: object, keepdims: bool) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True) if x.size else np.zeros((1,) * x.ndim)
    s = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return s if keepdims else np.squeeze(s, axis=axis) if axis is not None else s.reshape(())


# name -> float64 reference on (x, axis, keepdims)
REFERENCE: dict[str, Callable[..., np.ndarray]] = {
    "sum": lambda x, ax, kd: np.sum(x, axis=ax, keepdims=kd),
    "prod": lambda x, ax, kd: np.prod(x, axis=ax, keepdims=kd),
    "max": lambda x, ax, kd: np.max(x, axis=ax, keepdims=kd),
    "min": lambda x, ax, kd: np.min(x, axis=ax, keepdims=kd),
    "mean": lambda x, ax, kd: np.mean(x, axis=ax, keepdims=kd),
    "var": lambda x, ax, kd: np.var(x, axis=ax, keepdims=kd),
    "logsumexp": _lse,
}
FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int8", "int32", "int64", "uint8"]
DTYPES: dict[str, list[str]] = {
    "sum": FLOATS + INTS, "prod": FLOATS + INTS, "max": [*FLOATS, *INTS, "bool"],
    "min": [*FLOATS, *INTS, "bool"], "mean": FLOATS, "var": FLOATS, "logsumexp": FLOATS,
}
CASES: list[tuple[tuple[int, ...], object]] = [
    ((), None), ((7,), None), ((7,), 0), ((3, 4), 1), ((3, 4), -2), ((3, 4), (0, 1)),
    ((2, 3, 4), (0, 2)), ((2, 3, 4), -1), ((2, 1, 3), None),
]
EMPTY_CASES: list[tuple[tuple[int, ...], object]] = [((0,), None), ((2, 0, 3), 1), ((2, 0, 3), (0, 2))]


def _int_ref(op: str, x: np.ndarray, ax: object, kd: bool, dtype: str) -> np.ndarray:
    # the SDK sums and multiplies integers in int64, as numpy does (uint8: numpy's uint64)
    return REFERENCE[op](x.astype(np.int64), ax, kd) if op in ("sum", "prod") \
        else REFERENCE[op](x, ax, kd)


@pytest.mark.parametrize("op", list(REFERENCE))
@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_matches_numpy(op: str, shape: tuple[int, ...], axis: object, keepdims: bool,
                                 rng: np.random.Generator, seed: int) -> None:
    for dtype in DTYPES[op]:
        x = random_array(rng, shape, dtype, low=-2, high=2)
        got = getattr(tp, op)(Tensor.from_array(x), axis, keepdims).numpy()
        what = f"{op}{shape} axis={axis} keepdims={keepdims} {dtype} seed={seed}"
        if dtype in FLOATS:
            want = REFERENCE[op](x.astype(np.float64), axis, keepdims)
            assert got.dtype == x.dtype, what
            # float16 rounds every input and the result; prod/var/logsumexp grow the error a little
            assert_close(got, want, dtype, rtol=2 * TOLERANCE[dtype][0], what=what)
        elif dtype == "bool":
            assert_close(got, REFERENCE[op](x, axis, keepdims), what=what)
        else:
            want = _int_ref(op, x, axis, keepdims, dtype)
            assert got.dtype == want.dtype, what
            assert_close(got, want, what=what)


@pytest.mark.parametrize("shape,axis", EMPTY_CASES)
def test_reductions_over_nothing_follow_numpy(shape: tuple[int, ...], axis: object) -> None:
    x = Tensor.from_array(np.zeros(shape, np.float32))
    want_shape = np.sum(np.zeros(shape), axis=axis).shape
    assert_close(tp.sum(x, axis).numpy(), np.zeros(want_shape), "float32")
    assert_close(tp.prod(x, axis).numpy(), np.ones(want_shape), "float32")
    assert np.isnan(tp.mean(x, axis).numpy()).all() and tp.mean(x, axis).shape == want_shape
    assert (tp.logsumexp(x, axis).numpy() == -np.inf).all()
    for op in ("max", "min", "argmax"):
        ax = axis if op != "argmax" or not isinstance(axis, tuple) else axis[0]
        over_nothing = np.zeros(shape).sum(axis=ax, keepdims=True).size > 0
        if over_nothing:  # numpy raises too: the extremum of nothing is undefined
            with pytest.raises(ShapeError, match=rf"{op}.*{re.escape(str(shape))}"):
                getattr(tp, op)(x, ax)
        else:  # nothing to compute: an empty result, as in numpy
            assert getattr(tp, op)(x, ax).numpy().shape == getattr(np, op)(np.zeros(shape), ax).shape


def test_empty_output_of_a_nonempty_reduction_is_allowed() -> None:
    # reducing a non-empty axis of an empty tensor gives an empty result, not an error
    x = Tensor.from_array(np.zeros((0, 3), np.float32))
    assert tp.max(x, 1).shape == (0,)
    assert tp.max(x, 1).numpy().shape == (0,)


def test_logsumexp_is_stable_for_large_and_infinite_inputs(rng: np.random.Generator, seed: int) -> None:
    x = rng.uniform(-5, 5, (3, 6)) + 1000.0
    want = np.log(np.sum(np.exp(x - 1000.0), axis=1)) + 1000.0
    assert_close(tp.logsumexp(Tensor.from_array(x), 1).numpy(), want, "float64", what=f"seed={seed}")
    neg = np.full((2, 3), -np.inf)
    neg[0, 1] = 0.0
    assert_close(tp.logsumexp(Tensor.from_array(neg), 1).numpy(), np.array([0.0, -np.inf]), "float64")


@pytest.mark.parametrize("ddof", [0, 1, 2])
def test_var_with_ddof(ddof: int, rng: np.random.Generator, seed: int) -> None:
    x = rng.standard_normal((4, 5))
    for axis in (None, 0, (0, 1), -1):
        got = tp.var(Tensor.from_array(x), axis, ddof=ddof).numpy()
        assert_close(got, np.var(x, axis=axis, ddof=ddof), "float64", what=f"axis={axis} seed={seed}")
    with pytest.raises(ShapeError, match=r"var.*ddof=5.*\(4, 5\)"):
        tp.var(Tensor.from_array(x), 1, ddof=5)


def test_integer_reductions_take_numpys_dtypes(rng: np.random.Generator) -> None:
    x = rng.integers(-5, 6, (3, 4)).astype(np.int8)
    for op in ("mean", "var"):
        m = getattr(tp, op)(Tensor.from_array(x), 0)
        assert m.dtype == tp.float64
        assert_close(m.numpy(), getattr(x, op)(0), "float64")
    s = tp.sum(Tensor.from_array(x > 0))
    assert s.dtype == tp.int64 and s.item() == int((x > 0).sum())
    big = Tensor.from_array(np.full(300, 100, np.int8))
    assert tp.sum(big).dtype == tp.int64 and tp.sum(big).item() == 30000  # no int8 wrap
    assert tp.logsumexp(Tensor.from_array(x)).dtype == tp.float16  # as np.exp(int8)


def test_reductions_take_torch_spellings() -> None:
    x = np.arange(24.0).reshape(2, 3, 4)
    t = Tensor.from_array(x)
    np.testing.assert_array_equal(t.sum(dim=1).numpy(), x.sum(axis=1))
    np.testing.assert_array_equal(tp.mean(t, dim=(0, 2), keepdim=True).numpy(),
                                  x.mean(axis=(0, 2), keepdims=True))
    np.testing.assert_array_equal(t.max(dim=-1, keepdims=True).numpy(), x.max(-1, keepdims=True))
    np.testing.assert_array_equal(t.argmax(dim=2).numpy(), x.argmax(2))
    np.testing.assert_array_equal(t.var(dim=0, ddof=1).numpy(), x.var(0, ddof=1))
    assert t.sum(1, True).shape == (2, 1, 4)  # positional: numpy's order
    with pytest.raises(TypeError, match=r"sum\(\) got both axis= and dim="):
        t.sum(axis=1, dim=1)
    with pytest.raises(TypeError, match=r"both keepdims= and keepdim="):
        tp.prod(t, keepdims=True, keepdim=True)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8", "int64", "bool"])
def test_arg_reductions_match_numpy(op: str, dtype: str, rng: np.random.Generator, seed: int) -> None:
    # small integer ranges make ties: the first index wins, as in numpy
    x = random_array(rng, (3, 4, 5), dtype, low=-2, high=2)
    ref = getattr(np, op)
    for axis in (None, 0, 1, -1):
        for kd in (False, True):
            got = getattr(tp, op)(Tensor.from_array(x), axis, kd)
            assert got.dtype == tp.int64
            assert_close(got.numpy(), ref(x, axis=axis, keepdims=kd), what=f"{axis} {kd} seed={seed}")
    assert getattr(Tensor.from_array(np.float32(3.0)), op)().item() == 0


def test_arg_reductions_are_not_differentiable() -> None:
    assert not optable.get("argmax").differentiable and not optable.get("argmin").differentiable
    # their int64 result stops gradients: what flows through the cast is zero
    x = Tensor.from_array(np.array([[1.0, 4.0, 2.0]]))
    (g,) = tp.grad(tp.argmax(x, 1).astype("float64").sum() + tp.sum(x), [x])
    np.testing.assert_array_equal(g.numpy(), np.ones((1, 3)))


# --- gradients ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod", "var", "logsumexp"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, False), ((0, 2), True), (-1, True)])
def test_reduction_gradients(op: str, axis: object, keepdims: bool, rng: np.random.Generator,
                             seed: int) -> None:
    # values spread apart so max/min have no near-ties and prod no near-zeros
    x = rng.permutation(np.linspace(0.5, 2.0, 24)).reshape(2, 3, 4) * rng.choice([-1, 1], (2, 3, 4))
    try:
        check_grad(lambda t: getattr(tp, op)(t, axis, keepdims), [x], seed=seed)
    except AssertionError as e:
        raise AssertionError(f"{op} axis={axis} seed={seed}: {e}") from None


def test_max_gradient_is_split_among_ties() -> None:
    # two-way ties: central differences see 1/2 on each, which is the split rule too
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, -1.0, 2.0, 1.5]])
    check_grad(lambda t: tp.max(t, 1), [x])
    check_grad(lambda t: tp.min(t, 0), [np.array([[1.0, 3.0], [1.0, 3.0], [4.0, 5.0]])])
    # k-way ties get 1/k each (finite differences cannot show this: one-sided at a k-tie)
    t = Tensor.from_array(np.array([5.0, 5.0, 5.0, 1.0]))
    (g,) = tp.grad(tp.max(t), [t])
    np.testing.assert_allclose(g.numpy(), [1 / 3, 1 / 3, 1 / 3, 0.0], rtol=1e-12)
    t2 = Tensor.from_array(np.array([[2.0, 2.0], [0.0, 7.0]]))
    (g2,) = tp.grad((tp.max(t2) * 4.0), [t2])
    np.testing.assert_allclose(g2.numpy(), [[0.0, 0.0], [0.0, 4.0]], rtol=1e-12)


def test_prod_gradient_with_zeros(rng: np.random.Generator, seed: int) -> None:
    x = rng.uniform(0.5, 1.5, (3, 4))
    x[0, 1] = 0.0            # one zero in row 0: only it gets a gradient (the others' product)
    x[1, 0] = x[1, 3] = 0.0  # two zeros in row 1: no gradient anywhere in the row
    check_grad(lambda t: tp.prod(t, 1), [x], seed=seed)
    check_grad(lambda t: tp.prod(t), [x], seed=seed)
    t = Tensor.from_array(x)
    (g,) = tp.grad(tp.prod(t, 1).sum(), [t])
    want = np.zeros_like(x)
    want[0, 1] = np.prod(np.delete(x[0], 1))
    want[2] = np.prod(x[2]) / x[2]
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-12, err_msg=f"seed={seed}")


def test_second_order_through_logsumexp(rng: np.random.Generator, seed: int) -> None:
    x = rng.standard_normal((2, 3))
    check_grad(lambda t: tp.grad(tp.logsumexp(t, 1).sum(), [t])[0], [x], seed=seed)


# --- inference and errors --------------------------------------------------------------------


def test_bad_axes_name_the_op_and_shape() -> None:
    x = Tensor.from_array(np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeError, match=r"sum.*axis 2 is out of range.*\(2, 3\)"):
        tp.sum(x, 2)
    with pytest.raises(ShapeError, match=r"mean.*repeated axis"):
        tp.mean(x, (1, -1))
    with pytest.raises(ShapeError, match=r"argmax.*axis -3.*\(2, 3\)"):
        tp.argmax(x, -3)
    with pytest.raises(DTypeError, match=r"logsumexp.*int32"):  # the IR op takes floats only
        apply("logsumexp", [Tensor.from_array(np.zeros(3, np.int32))])


_shapes = st.lists(st.integers(0, 4), min_size=1, max_size=4).map(tuple)


@given(shape=_shapes, data=st.data(), keepdims=st.booleans())
def test_reduction_shapes_agree_with_numpy(shape: tuple[int, ...], data: st.DataObject,
                                           keepdims: bool) -> None:
    nd = len(shape)
    axes = data.draw(st.none() | st.lists(st.integers(-nd - 1, nd), max_size=nd + 1))
    x = Tensor.from_array(np.zeros(shape, np.float32))
    try:
        want = np.sum(np.zeros(shape), axis=None if axes is None else tuple(axes), keepdims=keepdims).shape
    except (ValueError, IndexError):  # numpy's AxisError: out of range or repeated
        with pytest.raises(ShapeError):
            tp.sum(x, axes, keepdims)
        return
    assert tp.sum(x, axes, keepdims).shape == want
    assert tp.mean(x, axes, keepdims).shape == want
    nonempty = all(shape[a] > 0 for a in (range(nd) if axes is None else axes))
    if nonempty:
        assert tp.max(x, axes, keepdims).shape == want
    else:
        with pytest.raises(ShapeError):
            tp.max(x, axes, keepdims)


def test_errors_are_graph_errors_not_numpy_errors() -> None:
    x = Tensor.from_array(np.zeros((2, 3), np.float32))
    for bad in (lambda: tp.sum(x, 9), lambda: tp.max(x, [0, 0]), lambda: tp.argmin(x, 2)):
        with pytest.raises(GraphError):
            bad()
