"""The nn ops other than conv/pool: softmax, losses, embedding, one_hot, dropout and the
normalisations — values against float64 numpy references written here, gradients
against finite differences, and the errors users meet."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from triplane.engines.op.numpy_kernels.random import uniform01
from triplane.proto import dtypes as dt
from triplane.proto.errors import AttrError, DTypeError, KernelError, NotDifferentiableError, ShapeError
from triplane.sdk.autograd import grad
from triplane.sdk.nn import functional as F
from triplane.sdk.tensor import Tensor
from triplane.testing import TOLERANCE, assert_close, check_grad, run_op

FLOATS = ["float64", "float32", "float16", "bfloat16"]
T = Tensor.from_array




def tol(dtype: str) -> tuple[float, float]:
    # These ops sum along an axis; float32 gets room for the accumulated rounding.
    r, a = TOLERANCE[dtype]
    return (max(r, 1e-5), max(a, 1e-5)) if dtype == "float32" else (r, a)


def close(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    r, a = tol(dtype)
    assert_close(got, want, dtype, rtol=r, atol=a, what=what)


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, low: float = -3,
         high: float = 3) -> np.ndarray:
    return rng.uniform(low, high, size=shape).astype(dt.dtype(dtype).np)


def grad_ok(fn: Callable[..., Tensor], inputs: list[np.ndarray], seed: int, **kw: object) -> None:
    try:
        check_grad(fn, inputs, **kw)  # type: ignore[arg-type]
    except AssertionError as e:
        raise AssertionError(f"seed={seed}: {e}") from None


def ref_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


# --- softmax, log_softmax -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("shape", "axis"), [((7,), 0), ((4, 5), -1), ((3, 4, 5), 1), ((2, 3, 4), 0)])
def test_softmax_and_log_softmax_match_reference(shape: tuple[int, ...], axis: int, dtype: str,
                                                 rng: np.random.Generator, seed: int) -> None:
    x = data(rng, shape, dtype, -10, 10)
    want = ref_log_softmax(x, axis)
    close(F.log_softmax(T(x), axis).numpy(), want, dtype, f"log_softmax {dtype} seed={seed}")
    close(F.softmax(T(x), axis).numpy(), np.exp(want), dtype, f"softmax {dtype} seed={seed}")


def test_softmax_is_stable_for_huge_logits() -> None:
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]], dtype=np.float32)
    np.testing.assert_allclose(F.softmax(T(x)).numpy(), [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    want = [-np.log(2), -np.log(2), -2000.0 - np.log(2)]
    np.testing.assert_allclose(F.log_softmax(T(x)).numpy()[0], want, rtol=1e-6)


@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_gradients(axis: int, rng: np.random.Generator, seed: int) -> None:
    x = rng.standard_normal((3, 4))
    grad_ok(lambda t: F.softmax(t, axis), [x], seed)
    grad_ok(lambda t: F.log_softmax(t, axis), [x], seed)


# --- cross_entropy --------------------------------------------------------------------------------


def ref_cross_entropy(logits: np.ndarray, labels: np.ndarray, reduction: str, ignore_index: int | None,
                      smoothing: float) -> np.ndarray:
    logp = ref_log_softmax(logits, 0 if logits.ndim == 1 else 1)
    logp = np.moveaxis(logp, 0 if logits.ndim == 1 else 1, -1)
    c = logp.shape[-1]
    keep = np.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
    loss = np.zeros(labels.shape)
    for pos in np.ndindex(labels.shape):
        if keep[pos]:
            row = logp[pos]
            loss[pos] = -(1 - smoothing) * row[labels[pos]] - smoothing * row.sum() / c
    if reduction == "none":
        return loss
    return np.asarray(loss.sum() if reduction == "sum" else loss.sum() / keep.sum())


CE_CASES = [((5,), ()), ((6, 4), (6,)), ((3, 5, 2, 3), (3, 2, 3))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shapes", CE_CASES, ids=["unbatched", "NC", "NCd1d2"])
def test_cross_entropy_matches_reference(shapes: tuple, reduction: str, dtype: str,
                                         rng: np.random.Generator, seed: int) -> None:
    lshape, yshape = shapes
    c = lshape[0] if len(lshape) == 1 else lshape[1]
    logits = data(rng, lshape, dtype)
    labels = rng.integers(0, c, size=yshape)
    for ignore, smoothing in [(None, 0.0), (1, 0.0), (None, 0.2), (2, 0.1)]:
        if ignore is not None:  # at least one ignored label (when batched) and one counted
            flat = labels.reshape(-1)
            flat[0], flat[-1] = ignore, (ignore + 1) % c
        got = F.cross_entropy(T(logits), T(labels), reduction, ignore, smoothing).numpy()
        assert got.dtype == logits.dtype
        want = ref_cross_entropy(logits, labels, reduction, ignore, smoothing)
        close(got, want, dtype, f"{reduction} ignore={ignore} smoothing={smoothing} seed={seed}")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_gradient_wrt_logits(reduction: str, rng: np.random.Generator, seed: int) -> None:
    labels = np.array([0, 2, 1, 2, 3])
    logits = rng.standard_normal((5, 4))
    grad_ok(lambda x, y: F.cross_entropy(x, y, reduction), [logits, labels], seed)
    grad_ok(lambda x, y: F.cross_entropy(x, y, reduction, ignore_index=2), [logits, labels], seed)
    grad_ok(lambda x, y: F.cross_entropy(x, y, reduction, ignore_index=0, label_smoothing=0.3),
            [logits, labels], seed)
    labels2 = rng.integers(0, 3, size=(2, 2, 2))
    grad_ok(lambda x, y: F.cross_entropy(x, y, reduction, ignore_index=1),
            [rng.standard_normal((2, 3, 2, 2)), labels2], seed)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_fast_path_equals_the_general_one(reduction: str, rng: np.random.Generator) -> None:
    """(N, C) logits, no ignore_index, no smoothing take a shorter kernel path; an
    ignore_index that no label equals takes the general one: the same bits."""
    logits = rng.standard_normal((7, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 7)
    x = T(logits)
    fast = F.cross_entropy(x, T(labels), reduction)
    general = F.cross_entropy(x, T(labels), reduction, ignore_index=-100)
    np.testing.assert_array_equal(fast.numpy(), general.numpy())
    seed_g = T(np.ones(fast.shape, np.float32) * 0.5)
    (g_fast,) = grad(fast, [x], seed_g)
    (g_general,) = grad(general, [x], seed_g)
    np.testing.assert_array_equal(g_fast.numpy(), g_general.numpy())
    with pytest.raises(KernelError, match="out of range"):
        F.cross_entropy(x, T(np.array([0, 1, 2, 3, 4, 5, 0])), reduction).numpy()


def test_cross_entropy_ignored_labels_get_zero_gradient(rng: np.random.Generator) -> None:
    x = T(rng.standard_normal((3, 4)))
    (g,) = grad(F.cross_entropy(x, T(np.array([1, -100, 2])), ignore_index=-100), [x])
    np.testing.assert_array_equal(g.numpy()[1], np.zeros(4))
    assert np.all(g.numpy()[0] != 0)


def test_cross_entropy_labels_have_no_gradient(rng: np.random.Generator) -> None:
    x, y = T(rng.standard_normal((3, 4))), T(np.array([1, 0, 2]))
    with pytest.raises(NotDifferentiableError, match="only floating-point"):
        grad(F.cross_entropy(x, y), [y])


# --- mse_loss -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_matches_reference(reduction: str, dtype: str, rng: np.random.Generator, seed: int) -> None:
    x, y = data(rng, (4, 5), dtype), data(rng, (5,), dtype)
    d = (x.astype(np.float64) - y.astype(np.float64)) ** 2
    want = {"mean": d.mean(), "sum": d.sum(), "none": d}[reduction]
    close(F.mse_loss(T(x), T(y), reduction).numpy(), np.asarray(want), dtype, f"seed={seed}")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_gradients_to_both_operands(reduction: str, rng: np.random.Generator, seed: int) -> None:
    for xs, ys in [((3, 4), (3, 4)), ((2, 3), (3,))]:
        ins = [rng.standard_normal(xs), rng.standard_normal(ys)]
        grad_ok(lambda a, b: F.mse_loss(a, b, reduction), ins, seed)


# --- embedding, one_hot ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding_picks_rows(dtype: str, rng: np.random.Generator, seed: int) -> None:
    w = data(rng, (7, 3), dtype)
    for idx in [rng.integers(0, 7, size=(4,)), rng.integers(0, 7, size=(2, 3)), np.array(5)]:
        got = F.embedding(T(idx.astype(np.int32)), T(w)).numpy()
        assert got.shape == (*idx.shape, 3)
        np.testing.assert_array_equal(got, w[idx], err_msg=f"seed={seed}")


def test_embedding_gradient_accumulates_repeated_indices(rng: np.random.Generator, seed: int) -> None:
    idx = np.array([[1, 3, 1], [1, 0, 3]])
    grad_ok(lambda w, i: F.embedding(i, w), [rng.standard_normal((5, 2)), idx], seed)
    w = T(rng.standard_normal((5, 2)))
    (g,) = grad(F.embedding(T(idx), w).sum(), [w])
    np.testing.assert_array_equal(g.numpy(), [[1, 1], [3, 3], [0, 0], [2, 2], [0, 0]])


def test_one_hot(rng: np.random.Generator, seed: int) -> None:
    idx = rng.integers(0, 5, size=(3, 4))
    got = F.one_hot(T(idx), 5).numpy()
    assert got.dtype == np.float32 and got.shape == (3, 4, 5)
    np.testing.assert_array_equal(got, np.eye(5)[idx], err_msg=f"seed={seed}")
    np.testing.assert_array_equal(F.one_hot(T(np.array([2, 0])), 3, dtype="int32").numpy(),
                                  np.array([[0, 0, 1], [1, 0, 0]], dtype=np.int32))


# --- dropout --------------------------------------------------------------------------------------


def test_dropout_same_seed_same_mask_and_follows_the_rng_contract(rng: np.random.Generator,
                                                                  seed: int) -> None:
    x = rng.uniform(1, 2, size=(40, 50))
    s = int(rng.integers(0, 2**53))
    a, b = F.dropout(T(x), 0.3, seed=s).numpy(), F.dropout(T(x), 0.3, seed=s).numpy()
    np.testing.assert_array_equal(a, b)
    keep = (uniform01(s, x.size) >= 0.3).reshape(x.shape)
    np.testing.assert_allclose(a, np.where(keep, x / 0.7, 0.0), rtol=1e-12, err_msg=f"seed={seed}")
    assert not np.array_equal(a != 0, F.dropout(T(x), 0.3, seed=s + 1).numpy() != 0)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_keep_rate_is_one_minus_p(p: float, rng: np.random.Generator, seed: int) -> None:
    n = 40_000
    kept = np.mean(F.dropout(T(np.ones(n)), p, seed=int(rng.integers(0, 2**53))).numpy() != 0)
    # binomial: 5 standard deviations
    assert abs(kept - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), f"kept {kept}, p={p}, seed={seed}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_dropout_eval_and_p0_are_identity(dtype: str, rng: np.random.Generator) -> None:
    x = data(rng, (3, 4), dtype)
    np.testing.assert_array_equal(F.dropout(T(x), 0.5, training=False).numpy(), x)
    np.testing.assert_array_equal(F.dropout(T(x), 0.0).numpy(), x)
    np.testing.assert_array_equal(run_op("dropout", [x], p=0.5, seed=3, training=False), x)
    y = F.dropout(T(x), 0.5, seed=9).numpy()
    assert y.dtype == x.dtype


def test_dropout_without_seed_draws_fresh_masks(rng: np.random.Generator) -> None:
    x = T(np.ones((20, 20)))
    assert not np.array_equal(F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5).numpy())


def test_dropout_gradient_uses_the_same_mask(rng: np.random.Generator, seed: int) -> None:
    grad_ok(lambda t: F.dropout(t, 0.4, seed=11), [rng.standard_normal((4, 5))], seed)


# --- layer_norm -----------------------------------------------------------------------------------


def ref_norm(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mu = x.mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + eps)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("shape", "k"), [((4, 6), 1), ((2, 3, 4), 2), ((5,), 1)])
def test_layer_norm_matches_reference(shape: tuple[int, ...], k: int, dtype: str,
                                      rng: np.random.Generator, seed: int) -> None:
    x = data(rng, shape, dtype)
    w, b = data(rng, shape[-k:], dtype), data(rng, shape[-k:], dtype)
    axes = tuple(range(len(shape) - k, len(shape)))
    want = ref_norm(x, axes, 1e-5) * w.astype(np.float64) + b.astype(np.float64)
    close(F.layer_norm(T(x), shape[-k:], T(w), T(b)).numpy(), want, dtype, f"seed={seed}")
    close(F.layer_norm(T(x), shape[-k:], eps=0.1).numpy(), ref_norm(x, axes, 0.1), dtype, f"seed={seed}")


@pytest.mark.parametrize(("shape", "k"), [((3, 4), 1), ((2, 2, 3), 2)])
def test_layer_norm_gradients(shape: tuple[int, ...], k: int, rng: np.random.Generator, seed: int) -> None:
    ns = shape[-k:]
    grad_ok(lambda x, w, b: F.layer_norm(x, ns, w, b),
            [rng.standard_normal(shape), rng.standard_normal(ns), rng.standard_normal(ns)], seed)


# --- batch_norm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 4, 4)])
def test_batch_norm_training_and_eval_match_reference(shape: tuple[int, ...], dtype: str,
                                                      rng: np.random.Generator, seed: int) -> None:
    c = shape[1]
    x, w, b = data(rng, shape, dtype), data(rng, (c,), dtype), data(rng, (c,), dtype)
    rm, rv = data(rng, (c,), dtype), data(rng, (c,), dtype, 0.5, 2)
    cs = (1, c) + (1,) * (len(shape) - 2)
    axes = tuple(i for i in range(len(shape)) if i != 1)
    f64 = [a.astype(np.float64) for a in (x, w, b, rm, rv)]
    y, new_m, new_v = F.batch_norm(T(x), T(rm), T(rv), T(w), T(b), training=True, momentum=0.2)
    close(y.numpy(), ref_norm(x, axes, 1e-5) * f64[1].reshape(cs) + f64[2].reshape(cs), dtype, f"seed={seed}")
    close(new_m.numpy(), 0.8 * f64[3] + 0.2 * f64[0].mean(axis=axes), dtype, f"seed={seed}")
    close(new_v.numpy(), 0.8 * f64[4] + 0.2 * f64[0].var(axis=axes, ddof=1), dtype, f"seed={seed}")
    ye = F.batch_norm(T(x), T(rm), T(rv), T(w), T(b), training=False, eps=1e-3).numpy()
    x64, w64, b64, rm64, rv64 = (a.reshape(cs) if a.ndim == 1 else a for a in f64)
    want = (x64 - rm64) / np.sqrt(rv64 + 1e-3) * w64 + b64
    close(ye, want, dtype, f"seed={seed}")


def test_batch_norm_gradients_training_and_eval(rng: np.random.Generator, seed: int) -> None:
    ins = [rng.standard_normal((3, 2, 2, 2)), rng.standard_normal(2), rng.standard_normal(2),
           rng.standard_normal(2), rng.uniform(0.5, 2, size=2)]
    grad_ok(lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=True)[0], ins, seed, wrt=[0, 1, 2])
    grad_ok(lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=False), ins, seed, wrt=[0, 1, 2])
    ins2d = [rng.standard_normal((5, 2)), *ins[1:]]
    grad_ok(lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=True)[0], ins2d, seed, wrt=[0, 1, 2])


def test_batch_norm_without_running_stats_in_training(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 3))
    y, m, v = F.batch_norm(T(x), None, None, training=True)
    assert m is None and v is None
    np.testing.assert_allclose(y.numpy(), ref_norm(x, (0,), 1e-5), rtol=1e-10)


# --- errors ---------------------------------------------------------------------------------------


def test_labels_out_of_range_fail_at_run_time_with_the_label() -> None:
    y = F.cross_entropy(T(np.zeros((3, 5), np.float32)), T(np.array([0, 7, 1])))
    pattern = r"cross_entropy.*label 7 at position \(1,\) is out of range for 5 classes"
    with pytest.raises(KernelError, match=pattern):
        y.numpy()
    neg = F.cross_entropy(T(np.zeros((2, 5), np.float32)), T(np.array([-1, 1])), ignore_index=-100)
    with pytest.raises(KernelError, match=r"label -1 .*ignore_index=-100"):
        neg.numpy()


def test_float_labels_are_a_dtype_error() -> None:
    pattern = r"cross_entropy: labels must be integer indices, got float32 of shape \(3,\)"
    with pytest.raises(DTypeError, match=pattern):
        F.cross_entropy(T(np.zeros((3, 5), np.float32)), T(np.zeros(3, np.float32)))


def test_cross_entropy_label_shape_errors() -> None:
    pattern = r"labels of shape \(4,\) do not fit logits of shape \(3, 5\).*\(3,\)"
    with pytest.raises(ShapeError, match=pattern):
        F.cross_entropy(T(np.zeros((3, 5), np.float32)), T(np.zeros(4, np.int64)))
    with pytest.raises(AttrError, match="'reduction' must be one of"):
        F.cross_entropy(T(np.zeros((3, 5), np.float32)), T(np.zeros(3, np.int64)), reduction="avg")


def test_dropout_p_out_of_range_is_an_attr_error() -> None:
    for p in (1.5, 1.0, -0.1):
        with pytest.raises(AttrError, match=r"dropout: attribute 'p'=.*must be in \[0, 1\)"):
            F.dropout(T(np.ones(3, np.float32)), p, seed=1)
        with pytest.raises(AttrError, match="'p'"):
            F.dropout(T(np.ones(3, np.float32)), p, training=False)


def test_dropout_seed_must_be_json_safe() -> None:
    with pytest.raises(AttrError, match=r"dropout: attribute 'seed'=.*must be in \[0, 2\*\*53\)"):
        F.dropout(T(np.ones(3, np.float32)), 0.5, seed=2**62)


def test_embedding_and_one_hot_index_errors() -> None:
    w = T(np.zeros((4, 2), np.float32))
    pattern = r"embedding.*index 4 at position \(0, 1\) is out of range .*\[0, 4\)"
    with pytest.raises(KernelError, match=pattern):
        F.embedding(T(np.array([[0, 4]])), w).numpy()
    with pytest.raises(DTypeError, match="indices must be integer"):
        F.embedding(T(np.array([0.0, 1.0], np.float32)), w)
    with pytest.raises(KernelError, match=r"one_hot.*index -1 .*3 classes"):
        F.one_hot(T(np.array([0, -1])), 3).numpy()


def test_normalisation_shape_errors() -> None:
    x = T(np.zeros((2, 3, 4), np.float32))
    pattern = r"normalized_shape \[3\] is not the trailing shape of input \(2, 3, 4\)"
    with pytest.raises(ShapeError, match=pattern):
        F.layer_norm(x, 3)
    pattern = r"layer_norm: weight \(3,\) and bias \(4,\) must have the normalised shape \(4,\)"
    with pytest.raises(ShapeError, match=pattern):
        F.layer_norm(x, 4, weight=T(np.ones(3, np.float32)))
    pattern = r"batch_norm: running_mean has shape \(4,\); input \(2, 3, 4\) has 3 channels"
    with pytest.raises(ShapeError, match=pattern):
        F.batch_norm(x, T(np.zeros(4, np.float32)), T(np.ones(3, np.float32)))
    with pytest.raises(AttrError, match=r"softmax: attribute 'axis'=3 is out of range .*\(2, 3, 4\)"):
        F.softmax(x, 3)


def test_softmax_takes_dim_and_computes_integers_in_float64() -> None:
    x = np.arange(6).reshape(2, 3)
    t = Tensor.from_array(x)
    for fn in (F.softmax, F.log_softmax):
        by_dim, by_axis = fn(t, dim=0), fn(t, axis=0)
        assert by_dim.dtype == dt.float64  # as np.exp(int64)
        np.testing.assert_array_equal(by_dim.numpy(), by_axis.numpy())
        with pytest.raises(TypeError, match="both axis= and dim="):
            fn(t, 0, dim=0)
    np.testing.assert_allclose(t.softmax(dim=1).numpy().sum(axis=1), [1.0, 1.0])
    np.testing.assert_allclose(t.log_softmax(dim=1).numpy(), t.log_softmax(-1).numpy())
