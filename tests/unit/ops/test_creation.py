"""Creation ops end to end: arange, eye, full and friends against numpy; the random ops
against the counter-based contract (recomputed here in pure Python), tiling by offset,
statistics and ranges; the SDK functions and seed stream; attribute errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import triplane as tp
from triplane.proto import optable
from triplane.proto.errors import AttrError, DTypeError, ShapeError
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.sdk.tensor import apply
from triplane.testing import TOLERANCE, assert_close

FLOATS = ["float16", "bfloat16", "float32", "float64"]



def make(op: str, **attrs: object) -> np.ndarray:
    return apply(op, [], **attrs).numpy()


# --- arange, eye, full --------------------------------------------------------------------------


_RANGES = [(0, 5, 1), (2, 11, 3), (5, 0, -1), (5, 0, -2), (0, 0, 1), (3, 1, 1), (-4, 4, 0.5),
           (0.1, 1.0, 0.3), (1.0, -1.0, -0.25), (0, 1, 0.1), (-2.5, 7.25, 1.75)]


def _integral(*vs: float) -> bool:
    return all(float(v).is_integer() for v in vs)


# integer dtypes only with integral start and step (numpy's integer arange of fractional
# steps is not something to copy)
@pytest.mark.parametrize(("start", "stop", "step", "dtype"), [
    (*r, d) for r in _RANGES for d in ("float32", "float64", "int32", "int64")
    if d.startswith("float") or _integral(r[0], r[2])])
def test_arange_matches_numpy(start: float, stop: float, step: float, dtype: str) -> None:
    got = make("arange", start=start, stop=stop, step=step, dtype=dtype)
    want = np.arange(start, stop, step, dtype=np.float64)
    assert got.shape == want.shape, f"arange({start}, {stop}, {step})"
    assert got.dtype == np.dtype(dtype)
    assert_close(got, want.astype(got.dtype), dtype if dtype in TOLERANCE else None,
                 what=f"arange({start}, {stop}, {step})")


def test_arange_integers_are_exact_up_to_2_to_the_53() -> None:
    # start/stop/step are float attributes (JSON numbers): integers are exact up to 2**53
    start = 2**53 - 20
    got = make("arange", start=start, stop=2**53, step=3, dtype="int64")
    np.testing.assert_array_equal(got, np.arange(start, 2**53, 3, dtype=np.int64))


def test_sdk_arange_signature_and_default_dtypes() -> None:
    assert tp.arange(4).dtype == tp.int64
    np.testing.assert_array_equal(tp.arange(4).numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(tp.arange(2, 8, 2).numpy(), [2, 4, 6])
    assert tp.arange(0, 1, 0.25).dtype == tp.float32
    assert tp.arange(3.0).dtype == tp.float32
    assert tp.arange(3, dtype="float64").dtype == tp.float64
    assert tp.arange(10, 0).shape == (0,)


@pytest.mark.parametrize(("n", "m", "k"), [(3, None, 0), (3, 5, 1), (4, 2, -1), (3, 3, 5), (3, 3, -4),
                                           (0, None, 0), (2, 0, 0), (1, 1, 0)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
def test_eye_matches_numpy(n: int, m: int | None, k: int, dtype: str) -> None:
    got = make("eye", n=n, m=m, k=k, dtype=dtype)
    want = np.eye(n, m, k)
    assert got.dtype.name == dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float64), want)
    np.testing.assert_array_equal(tp.eye(n, m, k, dtype=dtype).numpy().astype(np.float64), want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int8", "uint8", "bool"])
def test_full_and_friends(dtype: str) -> None:
    for shape in [(), (0,), (3,), (2, 3)]:
        assert_close(tp.zeros(shape, dtype).numpy(), np.zeros(shape), dtype if dtype in TOLERANCE else None)
        got = tp.ones(shape, dtype).numpy()
        assert got.dtype.name == dtype and got.shape == shape and np.all(got == 1)
        f = tp.full(shape, 1 if dtype == "bool" else 7, dtype).numpy()
        assert f.dtype.name == dtype and np.all(f == (True if dtype == "bool" else 7))
    assert tp.zeros(4).shape == (4,) and tp.zeros(4).dtype == tp.float32


def test_shapes_as_separate_ints() -> None:
    assert tp.zeros(3, 3).shape == (3, 3) and tp.zeros(3, 3).dtype == tp.float32
    o = tp.ones(2, 3, dtype="int8")
    assert o.shape == (2, 3) and o.dtype == tp.int8 and (o.numpy() == 1).all()
    assert tp.zeros([2, 3], tp.int32).dtype == tp.int32  # numpy's positional dtype
    assert tp.zeros(4, "uint8").shape == (4,)
    assert tp.ones((), dtype=bool).shape == ()
    assert tp.randn(4, 5).shape == (4, 5) and tp.rand(2, 3, dtype="float64").dtype == tp.float64
    with pytest.raises(TypeError, match="one dtype"):
        tp.zeros((2, 3), "int8", dtype="int8")
    with pytest.raises(TypeError, match="needs a shape"):
        tp.ones()
    with pytest.raises(TypeError, match="dtype= by name"):
        tp.randn((2, 3), "float64")


def test_full_value_sets_the_default_dtype() -> None:
    assert tp.full(2, 1.5).dtype == tp.float32
    assert tp.full(2, 3).dtype == tp.int64
    assert tp.full(2, True).dtype == tp.bool_
    with pytest.raises(DTypeError, match="not a number"):
        tp.full(2, "x")  # type: ignore[arg-type]


def test_full_of_nan_and_infinities() -> None:
    got = tp.full((2, 2), float("-inf")).numpy()
    assert got.shape == (2, 2) and np.all(got == -np.inf) and got.dtype == np.float32
    assert np.isnan(tp.full((), float("nan"), "float64").numpy())
    assert np.signbit(tp.full(3, -0.0).numpy()).all()
    with pytest.raises(AttrError, match="must be finite"):
        apply("full", [], value=float("inf"), shape=(2,))


def test_like_functions_follow_the_tensor() -> None:
    x = tp.tensor(np.ones((2, 3), dtype=np.int32))
    z = tp.zeros_like(x)
    assert z.shape == (2, 3) and z.dtype == tp.int32 and not z.numpy().any()
    assert tp.ones_like(x, dtype="float16").dtype == tp.float16
    np.testing.assert_array_equal(tp.full_like(x, 4).numpy(), np.full((2, 3), 4))


def test_tensor_keeps_data_and_dtype() -> None:
    t = tp.tensor([[1.0, 2.0]])
    assert t.dtype == tp.float32 and t.shape == (1, 2)
    assert tp.tensor([1, 2]).dtype == tp.int64
    assert tp.tensor(np.arange(3, dtype=np.int16)).dtype == tp.int16
    assert tp.tensor(3.5, dtype="float64").shape == ()
    r = tp.tensor(np.ones(2), requires_grad=True)
    assert r.requires_grad and r.dtype == tp.float64


# --- random: the counter-based contract -----------------------------------------------------

_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _u01(seed: int, i: int) -> float:
    bits = _mix((i * 0x9E3779B97F4A7C15 + _mix(seed & _M64)) & _M64)
    return (bits >> 11) * 2.0**-53


def _normal01(seed: int, i: int) -> float:
    u1, u2 = _u01(seed, i), _u01(seed ^ 0x5851F42D4C957F2D, i)
    return math.sqrt(-2.0 * math.log1p(-u1)) * math.cos(2.0 * math.pi * u2)


def test_uniform_follows_the_contract(seed: int) -> None:
    got = make("uniform", shape=(3, 4), seed=seed, low=-2.0, high=3.0, dtype="float64", offset=7)
    want = np.array([-2.0 + 5.0 * _u01(seed, 7 + i) for i in range(12)]).reshape(3, 4)
    assert_close(got, want, "float64", what=f"seed={seed}")


def test_normal_follows_the_contract(seed: int) -> None:
    got = make("normal", shape=(5,), seed=seed, mean=1.0, std=0.5, dtype="float64")
    want = np.array([1.0 + 0.5 * _normal01(seed, i) for i in range(5)])
    assert_close(got, want, "float64", what=f"seed={seed}")


@pytest.mark.parametrize("op", ["uniform", "normal"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_random_is_a_function_of_seed_and_index(op: str, dtype: str, seed: int) -> None:
    a = make(op, shape=(6, 5), seed=seed, dtype=dtype)
    assert a.dtype.name == dtype and a.shape == (6, 5)
    np.testing.assert_array_equal(make(op, shape=(6, 5), seed=seed, dtype=dtype), a)
    other = make(op, shape=(6, 5), seed=(seed + 1) % (1 << 53), dtype=dtype)
    assert np.mean(other != a) > 0.8, f"seeds {seed} and {seed + 1} give near-equal tensors"
    # a tile is the matching slice of the whole: rows 2..4 start at element 2 * 5
    tile = make(op, shape=(3, 5), seed=seed, dtype=dtype, offset=10)
    np.testing.assert_array_equal(tile, a[2:5], err_msg=f"seed={seed}")
    flat = make(op, shape=(7,), seed=seed, dtype=dtype, offset=13)
    np.testing.assert_array_equal(flat, a.reshape(-1)[13:20], err_msg=f"seed={seed}")
    # element i does not depend on the shape asked for
    np.testing.assert_array_equal(make(op, shape=(30,), seed=seed, dtype=dtype), a.reshape(-1))


@pytest.mark.parametrize("op", ["uniform", "normal"])
def test_large_tensors_and_cut_tiles_follow_the_contract(op: str, seed: int) -> None:
    # Larger than one generation chunk (65,536 elements): chunk edges must not shift the
    # index; elements are sampled against the scalar contract above.
    from triplane.engines.op.numpy_kernels.random import _CHUNK

    n = 3 * _CHUNK // 256 + 7  # rows of 256: a chunk edge falls inside the last chunk
    a = make(op, shape=(n, 256), seed=seed, dtype="float64")
    one = _u01 if op == "uniform" else _normal01
    for i in (0, _CHUNK - 1, _CHUNK, 2 * _CHUNK + 3, n * 256 - 1):
        assert a.reshape(-1)[i] == pytest.approx(one(seed, i), rel=1e-15, abs=1e-300), f"element {i}"
    # a tile cut along both axes (the indexed path) is the matching slice of the whole
    tile = make(op, shape=(n - 9, 200), seed=seed, dtype="float64", full_shape=(n, 256), start=(4, 31))
    np.testing.assert_array_equal(tile, a[4:n - 5, 31:231], err_msg=f"seed={seed}")


@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_values_are_in_range(dtype: str, seed: int) -> None:
    low, high = -1.5, 2.5
    a = make("uniform", shape=(4000,), seed=seed, low=low, high=high, dtype=dtype).astype(np.float64)
    assert a.min() >= low and a.max() <= high, f"seed={seed}"
    if dtype == "float64":
        assert a.max() < high
    assert make("uniform", shape=(3,), seed=seed, low=2.0, high=2.0, dtype=dtype).tolist() == [2.0] * 3


def test_random_statistics_are_sane(seed: int) -> None:
    n = 20000
    u = make("uniform", shape=(n,), seed=seed, dtype="float64")
    z = make("normal", shape=(n,), seed=seed, mean=3.0, std=2.0, dtype="float64")
    msg = f"seed={seed}"
    # six standard errors: a false alarm once in ~500 million runs
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n), msg
    assert abs(u.var() - 1 / 12) < 6 * math.sqrt(1 / 180 / n), msg
    assert abs(z.mean() - 3.0) < 6 * 2.0 / math.sqrt(n), msg
    assert abs(z.std() - 2.0) < 6 * 2.0 / math.sqrt(2 * n), msg
    # Kolmogorov-Smirnov against the exact CDFs (p < 1e-5 at this bound)
    k = np.arange(1, n + 1) / n
    assert np.max(np.abs(np.sort(u) - k)) < 2.5 / math.sqrt(n), msg
    cdf = 0.5 * (1 + np.vectorize(math.erf)((np.sort(z) - 3.0) / (2.0 * math.sqrt(2))))
    assert np.max(np.abs(cdf - k)) < 2.5 / math.sqrt(n), msg
    # neighbouring elements are not correlated
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 6 / math.sqrt(n), msg


def test_sdk_random_functions(seed: int) -> None:
    a = tp.uniform((2, 3), low=1.0, high=2.0, seed=seed)
    assert a.dtype == tp.float32 and a.shape == (2, 3)
    np.testing.assert_array_equal(a.numpy(), make("uniform", shape=(2, 3), low=1.0, high=2.0, seed=seed))
    n = tp.normal(4, mean=5.0, std=0.0, seed=seed, dtype="float64")
    np.testing.assert_array_equal(n.numpy(), [5.0] * 4)
    assert tp.rand(2, 3, seed=seed).shape == (2, 3) and tp.rand((2, 3), seed=seed).shape == (2, 3)
    np.testing.assert_array_equal(tp.rand(2, 3, seed=seed).numpy(), tp.uniform((2, 3), seed=seed).numpy())
    np.testing.assert_array_equal(tp.randn(5, seed=seed).numpy(), tp.normal(5, seed=seed).numpy())


def test_manual_seed_makes_runs_reproducible() -> None:
    tp.manual_seed(1234)
    a, b = tp.randn(8).numpy(), tp.rand(8).numpy()
    tp.manual_seed(1234)
    np.testing.assert_array_equal(tp.randn(8).numpy(), a)
    np.testing.assert_array_equal(tp.rand(8).numpy(), b)
    assert not np.array_equal(tp.randn(8).numpy(), a)  # the stream moves on
    tp.manual_seed(1235)
    assert not np.array_equal(tp.randn(8).numpy(), a)
    with pytest.raises(AttrError):
        tp.manual_seed(1.5)  # type: ignore[arg-type]


def test_random_nodes_survive_json_and_are_not_folded(seed: int) -> None:
    t = tp.normal((3,), seed=seed) * 2.0
    node = Graph.from_json(_graph_json(t))
    g = validate(node)
    ops = sorted(n.op for n in g.nodes.values())
    assert "normal" in ops
    assert optable.get("normal").random and optable.get("uniform").random
    np.testing.assert_allclose(t.numpy(), 2.0 * make("normal", shape=(3,), seed=seed), rtol=1e-6)


def _graph_json(t: tp.Tensor) -> bytes:
    from triplane.sdk.tensor import build_graph

    return build_graph([t])[0].to_json()


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "attrs", "pattern"), [
    ("uniform", {"shape": (2,), "seed": 1, "low": 2.0, "high": 1.0}, "low <= high"),
    ("uniform", {"shape": (2,), "seed": 1, "dtype": "int32"}, "floating-point"),
    ("uniform", {"shape": (2,), "seed": -1}, r"'seed'=-1: must be in \[0, 2\*\*53\)"),
    ("uniform", {"shape": (2,)}, "missing required attribute 'seed'"),
    ("uniform", {"shape": (2,), "seed": 1, "scale": 2.0}, r"unknown attribute\(s\) \['scale'\]"),
    ("normal", {"shape": (2,), "seed": 1, "std": -1.0}, "'std'=-1.0: must be >= 0"),
    ("normal", {"shape": (2,), "seed": 1, "offset": -3}, "'offset'"),
    ("normal", {"shape": (-2,), "seed": 1}, "non-negative"),
    ("arange", {"stop": 5, "step": 0}, "must not be zero"),
    ("arange", {"stop": float("inf")}, "must be finite"),
    ("arange", {"stop": 5, "dtype": "bool"}, "bool"),
    ("arange", {"start": 1}, "missing required attribute 'stop'"),
    ("eye", {"n": -1}, "must be >= 0"),
    ("eye", {"n": 2, "m": -3}, "must be >= 0"),
    ("eye", {"n": 2.5}, "must be an integer"),
    ("full", {"value": 1, "shape": (2,), "fill": 3}, "unknown attribute"),
])
def test_bad_attributes_are_attr_errors(op: str, attrs: dict[str, object], pattern: str) -> None:
    with pytest.raises(AttrError, match=pattern):
        apply(op, [], **attrs)


def test_creation_ops_take_no_inputs() -> None:
    x = tp.zeros(2)
    with pytest.raises(Exception, match="takes 0 input"):
        apply("eye", [x], n=2)


def test_sdk_shapes_are_checked() -> None:
    with pytest.raises(AttrError, match="shape"):
        tp.zeros(object())  # type: ignore[arg-type]
    with pytest.raises((AttrError, ShapeError), match="non-negative"):
        tp.ones((2, -1))
