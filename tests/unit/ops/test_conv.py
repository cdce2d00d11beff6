"""conv2d, max_pool2d and avg_pool2d: values against loop references, gradients against
finite differences, and the shape errors users meet."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import AttrError, DTypeError, ShapeError
from triplane.proto.ir import TensorType
from triplane.sdk.nn import functional as F
from triplane.sdk.tensor import Tensor
from triplane.testing import TOLERANCE, assert_close, check_grad

FLOATS = ["float64", "float32", "float16", "bfloat16"]




def tol(dtype: str) -> tuple[float, float]:
    # float32 results here sum up to C*kH*kW products of numbers up to 4 in magnitude:
    # accumulated rounding reaches ~1e-6 absolute, so float32 gets a little room.
    r, a = TOLERANCE[dtype]
    return (max(r, 1e-5), max(a, 1e-5)) if dtype == "float32" else (r, a)


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    from triplane.proto import dtypes as dt

    return rng.uniform(-2, 2, size=shape).astype(dt.dtype(dtype).np)


def grad_ok(fn: Callable[..., Tensor], inputs: list[np.ndarray], seed: int, **kw: object) -> None:
    try:
        check_grad(fn, inputs, **kw)  # type: ignore[arg-type]
    except AssertionError as e:
        raise AssertionError(f"seed={seed}: {e}") from None


# --- references: plain loops over output positions ------------------------------------------------


def out_size(size: int, k: int, s: int, p: int, d: int = 1) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def conv_ref(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], padding: tuple[int, int],
             dilation: tuple[int, int], groups: int) -> np.ndarray:
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho, wo = out_size(h, kh, sh, ph, dh), out_size(wd, kw, sw, pw, dw)
    out = np.zeros((n, o, ho, wo))
    per_group = o // groups
    for oc in range(o):
        g = oc // per_group
        for i in range(ho):
            for j in range(wo):
                patch = xp[:, g * cg:(g + 1) * cg, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                           j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[:, oc, i, j] = np.sum(patch * w[oc], axis=(1, 2, 3))
    return out


def pool_ref(x: np.ndarray, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int],
             kind: str) -> np.ndarray:
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    ho, wo = out_size(h, k[0], s[0], p[0]), out_size(w, k[1], s[1], p[1])
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            out[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else win.sum(axis=(2, 3)) / (k[0] * k[1])
    return out


# (x shape, w shape, stride, padding, dilation, groups)
CONV_CASES = [
    ((2, 3, 6, 6), (4, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    ((1, 2, 7, 6), (3, 2, 3, 2), (2, 1), (1, 2), (1, 1), 1),
    ((2, 4, 8, 8), (6, 2, 3, 3), (2, 2), (1, 1), (2, 2), 2),     # groups + dilation
    ((2, 3, 5, 5), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3),     # depthwise
    ((1, 4, 6, 5), (8, 1, 2, 3), (1, 2), (0, 1), (2, 1), 4),     # depthwise, multiplier 2
    ((3, 2, 4, 4), (5, 2, 1, 1), (1, 1), (0, 0), (1, 1), 1),     # 1x1
]


def conv_ids() -> Iterator[str]:
    for xs, ws, s, p, d, g in CONV_CASES:
        yield f"x{list(xs)}-w{list(ws)}-s{s[0]}{s[1]}-p{p[0]}{p[1]}-d{d[0]}{d[1]}-g{g}"


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONV_CASES, ids=list(conv_ids()))
def test_conv2d_matches_loop_reference(case: tuple, dtype: str, rng: np.random.Generator, seed: int) -> None:
    xs, ws, stride, padding, dilation, groups = case
    x, w = data(rng, xs, dtype), data(rng, ws, dtype)
    got = F.conv2d(Tensor.from_array(x), Tensor.from_array(w), stride=stride, padding=padding,
                   dilation=dilation, groups=groups).numpy()
    assert got.dtype == x.dtype
    r, a = tol(dtype)
    assert_close(got, conv_ref(x, w, stride, padding, dilation, groups), dtype, rtol=r, atol=a,
                 what=f"conv2d {case} {dtype} seed={seed}")


def test_conv2d_bias_and_int_arguments(rng: np.random.Generator, seed: int) -> None:
    x, w, b = (data(rng, s, "float64") for s in [(2, 3, 5, 5), (4, 3, 3, 3), (4,)])
    got = F.conv2d(Tensor.from_array(x), Tensor.from_array(w), Tensor.from_array(b), stride=2,
                   padding=1).numpy()
    want = conv_ref(x, w, (2, 2), (1, 1), (1, 1), 1) + b[None, :, None, None]
    assert_close(got, want, "float64", what=f"seed={seed}")


@pytest.mark.parametrize("case", CONV_CASES[:5], ids=list(conv_ids())[:5])
def test_conv2d_gradients_wrt_input_and_weight(case: tuple, rng: np.random.Generator, seed: int) -> None:
    xs, ws, stride, padding, dilation, groups = case
    xs = (1, *xs[1:])  # one image keeps the finite differences quick
    grad_ok(lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups),
            [rng.standard_normal(xs), rng.standard_normal(ws)], seed)


def test_conv2d_gradient_with_unused_trailing_rows(rng: np.random.Generator, seed: int) -> None:
    # stride 2 over 6 rows with a 3-row kernel leaves the last row unread: its gradient is 0.
    x = rng.standard_normal((1, 1, 6, 6))
    grad_ok(lambda x, w: F.conv2d(x, w, stride=2), [x, rng.standard_normal((2, 1, 3, 3))], seed)


def test_conv2d_cost_counts_multiply_adds() -> None:
    op = optable.get("conv2d")
    a = op.normalise_attrs({"stride": (1, 1), "groups": 2})
    ins = [TensorType((2, 4, 6, 6), dt.float32), TensorType((6, 2, 3, 3), dt.float32)]
    out = op.check(ins, a)
    assert out.shape == (2, 6, 4, 4)
    assert op.cost(ins, out, a).flops == 2 * (2 * 6 * 4 * 4) * (2 * 3 * 3)


# --- pooling --------------------------------------------------------------------------------------

POOL_CASES = [((2, 3, 6, 6), (2, 2), None, (0, 0)), ((1, 2, 7, 5), (3, 2), (2, 1), (1, 1)),
              ((2, 1, 5, 5), (3, 3), (2, 2), (1, 0)), ((1, 2, 4, 6), (1, 3), (1, 3), (0, 1))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_pools_match_loop_reference(case: tuple, kind: str, dtype: str, rng: np.random.Generator,
                                    seed: int) -> None:
    xs, k, s, p = case
    x = data(rng, xs, dtype)
    fn = F.max_pool2d if kind == "max" else F.avg_pool2d
    got = fn(Tensor.from_array(x), k, stride=s, padding=p).numpy()
    want = pool_ref(x, k, s if s is not None else k, p, kind)
    assert_close(got, want, dtype, what=f"{kind}_pool2d {case} {dtype} seed={seed}")


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_pool_gradients(case: tuple, kind: str, rng: np.random.Generator, seed: int) -> None:
    xs, k, s, p = case
    fn = F.max_pool2d if kind == "max" else F.avg_pool2d
    # distinct values keep every window's max away from a tie, where max has no derivative
    x = rng.permutation(np.prod(xs)).reshape(xs) * 0.1 + rng.uniform(0, 0.01, xs)
    grad_ok(lambda t: fn(t, k, stride=s, padding=p), [x], seed)


def test_max_pool_gradient_goes_to_the_first_maximum_on_ties() -> None:
    x = np.array([[[[1.0, 3.0, 3.0, 0.0],
                    [3.0, 2.0, 5.0, 5.0]]]])
    t = Tensor.from_array(x)
    from triplane.sdk.autograd import grad

    (g,) = grad(F.max_pool2d(t, 2).sum(), [t])
    np.testing.assert_array_equal(g.numpy(), [[[[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]]])


# --- errors ---------------------------------------------------------------------------------------


def t(shape: tuple[int, ...], dtype: str = "float32") -> Tensor:
    return Tensor.from_array(np.zeros(shape, dtype=dtype))


def test_conv2d_channel_mismatch_names_both_shapes() -> None:
    pattern = r"conv2d: weight expects 4 input channels.*has 3.*\(2, 3, 8, 8\).*\(5, 4, 3, 3\)"
    with pytest.raises(ShapeError, match=pattern):
        F.conv2d(t((2, 3, 8, 8)), t((5, 4, 3, 3)))


def test_conv2d_groups_must_divide_channels() -> None:
    with pytest.raises(ShapeError, match=r"conv2d: groups=2 must divide.*\(1, 3, 8, 8\)"):
        F.conv2d(t((1, 3, 8, 8)), t((4, 1, 3, 3)), groups=2)
    with pytest.raises(ShapeError, match=r"groups=2 must divide"):
        F.conv2d(t((1, 4, 8, 8)), t((3, 2, 3, 3)), groups=2)


def test_conv2d_kernel_larger_than_padded_input() -> None:
    pattern = r"conv2d: .*window \(7 after dilation\) is larger than the padded input \(3 \+ 2\*1\)"
    with pytest.raises(ShapeError, match=pattern):
        F.conv2d(t((1, 1, 3, 3)), t((1, 1, 4, 4)), padding=1, dilation=2)


def test_conv2d_rank_dtype_and_attr_errors() -> None:
    with pytest.raises(ShapeError, match=r"\(N, C, H, W\).*\(3, 8, 8\)"):
        F.conv2d(t((3, 8, 8)), t((1, 3, 3, 3)))
    with pytest.raises(DTypeError, match="input 0 has dtype int64"):
        F.conv2d(Tensor.from_array(np.zeros((1, 1, 3, 3), dtype=np.int64)),
                 Tensor.from_array(np.zeros((1, 1, 3, 3), dtype=np.int64)))
    with pytest.raises(AttrError, match=r"'stride'.*2 integers >= 1"):
        F.conv2d(t((1, 1, 4, 4)), t((1, 1, 3, 3)), stride=0)


def test_pool_errors() -> None:
    pattern = r"max_pool2d: padding \[2, 2\] must be at most half the kernel \[2, 2\]"
    with pytest.raises(AttrError, match=pattern):
        F.max_pool2d(t((1, 1, 6, 6)), 2, padding=2)
    with pytest.raises(ShapeError, match=r"avg_pool2d: .*\(1, 1, 2, 2\)"):
        F.avg_pool2d(t((1, 1, 2, 2)), 3)
    with pytest.raises(ShapeError, match=r"\(N, C, H, W\), got shape \(4, 4\)"):
        F.max_pool2d(t((4, 4)), 2)
