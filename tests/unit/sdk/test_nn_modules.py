"""nn modules: forward values against numpy, parameter discovery, modes, state dicts."""

from __future__ import annotations

import io

import numpy as np
import pytest

import triplane as tp
from triplane.proto.errors import ShapeError
from triplane.sdk import nn
from triplane.sdk.optim import SGD, flush_pending_updates
from triplane.sdk.tensor import Tensor
from triplane.testing import assert_close

# float32 results vs float64 references of a few dozen terms
RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def _x(rng: np.random.Generator, *shape: int) -> tuple[Tensor, np.ndarray]:
    a = rng.standard_normal(shape).astype(np.float32)
    return Tensor.from_array(a), a.astype(np.float64)


def _f64(t: Tensor) -> np.ndarray:
    return t.numpy().astype(np.float64)


def _conv_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int) -> np.ndarray:
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out + b[None, :, None, None]


def test_linear_forward_and_init(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tp.manual_seed(seed % 1000)
    lin = nn.Linear(5, 3)
    assert lin.weight.shape == (3, 5) and lin.bias is not None and lin.bias.shape == (3,)
    bound = 1 / np.sqrt(5)
    assert np.all(np.abs(lin.weight.numpy()) <= bound) and np.all(np.abs(lin.bias.numpy()) <= bound)
    x, xr = _x(rng, 4, 5)
    assert_close(lin(x).numpy(), xr @ _f64(lin.weight).T + _f64(lin.bias), rtol=RTOL, atol=ATOL,
                 what=f"seed={seed}")
    assert nn.Linear(5, 3, bias=False).bias is None


def test_manual_seed_makes_models_reproducible() -> None:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))

    tp.manual_seed(7)
    a = build().state_dict()
    tp.manual_seed(7)
    b = build().state_dict()
    tp.manual_seed(8)
    c = build().state_dict()
    assert list(a) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["0.weight"], c["0.weight"])
    assert not np.array_equal(a["0.weight"][:, :4], a["2.weight"][:, :4])  # layers differ too


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 3), nn.Tanh())
        self.heads = [nn.Linear(3, 1), nn.Linear(3, 1)]
        self.extra = {"scale": nn.Parameter(np.ones(1, np.float32))}
        self.shared = self.heads[0]  # the same module twice: its parameters count once
        self.not_a_param = Tensor.from_array(np.zeros(2, np.float32))

    def forward(self, x: Tensor) -> Tensor:
        h = self.body(x)
        return (self.heads[0](h) + self.heads[1](h)) * self.extra["scale"]


def test_parameters_are_found_recursively_once() -> None:
    net = _Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["extra.scale", "body.0.weight", "body.0.bias", "heads.0.weight", "heads.0.bias",
                     "heads.1.weight", "heads.1.bias"]
    assert len({id(p) for p in net.parameters()}) == 7
    assert all(p.requires_grad and p.is_leaf for p in net.parameters())
    loss = net(Tensor.from_array(np.ones((4, 2), np.float32))).sum()
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_train_eval_and_dropout() -> None:
    tp.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    assert all(m.training for m in net.modules())
    x = Tensor.from_array(np.ones((64, 4), np.float32))
    h = net[0](x).numpy()
    m1, m2 = net(x).numpy(), net(x).numpy()
    assert not np.array_equal(m1 == 0, m2 == 0), "dropout masks repeat from call to call"
    kept = m1 != 0
    assert 0.3 < kept.mean() < 0.7
    assert_close(m1[kept], 2 * h[kept], rtol=RTOL, atol=ATOL)
    net.eval()
    assert not any(m.training for m in net.modules())
    assert_close(net(x).numpy(), h)
    tp.manual_seed(0)
    again = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    np.testing.assert_array_equal(again(x).numpy(), m1)  # the same run repeats exactly


def test_state_dict_round_trip_through_npz(seed: int) -> None:
    tp.manual_seed(1)
    a = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(32, 3))
    tp.manual_seed(2)
    b = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(32, 3))
    a.eval()
    b.eval()
    sd = a.state_dict()
    assert "1.running_mean" in sd and "1.running_var" in sd
    buf = io.BytesIO()
    np.savez(buf, **sd)
    buf.seek(0)
    loaded = dict(np.load(buf, allow_pickle=False))
    x, _ = _x(np.random.default_rng(seed), 2, 1, 4, 4)
    assert not np.allclose(a(x).numpy(), b(x).numpy())
    b.load_state_dict(loaded)
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    sd["3.weight"] = np.zeros((3, 31), np.float32)
    with pytest.raises(ValueError, match=r"'3.weight' has shape \[3, 31\].*\[3, 32\]"):
        b.load_state_dict(sd)
    with pytest.raises(KeyError, match=r"missing.*0\.bias"):
        b.load_state_dict({k: v for k, v in loaded.items() if k != "0.bias"})


def test_conv_and_pool_modules_match_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    conv = nn.Conv2d(2, 3, 3, stride=1, padding=1)
    x, xr = _x(rng, 2, 2, 5, 5)
    y = conv(x)
    want = _conv_ref(xr, _f64(conv.weight), _f64(conv.bias), 1, 1)
    assert_close(y.numpy(), want, rtol=RTOL, atol=ATOL, what=f"seed={seed}")
    x4, x4r = _x(rng, 1, 2, 4, 4)
    blocks = x4r.reshape(1, 2, 2, 2, 2, 2)
    assert_close(nn.MaxPool2d(2)(x4).numpy(), blocks.max(axis=(3, 5)), what=f"seed={seed}")
    assert_close(nn.AvgPool2d(2)(x4).numpy(), blocks.mean(axis=(3, 5)), rtol=RTOL, atol=ATOL,
                 what=f"seed={seed}")
    assert nn.Flatten()(x4).shape == (1, 32)


def test_activations_layernorm_embedding(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, xr = _x(rng, 3, 4)
    assert_close(nn.ReLU()(x).numpy(), np.maximum(xr, 0), what=f"seed={seed}")
    assert_close(nn.Tanh()(x).numpy(), np.tanh(xr), rtol=RTOL, atol=ATOL, what=f"seed={seed}")
    assert_close(nn.Sigmoid()(x).numpy(), 1 / (1 + np.exp(-xr)), rtol=RTOL, atol=ATOL, what=f"seed={seed}")
    ln = nn.LayerNorm(4)
    mu, var = xr.mean(-1, keepdims=True), xr.var(-1, keepdims=True)
    assert_close(ln(x).numpy(), (xr - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5, what=f"seed={seed}")
    emb = nn.Embedding(10, 3)
    idx = rng.integers(0, 10, size=(2, 5))
    assert_close(emb(Tensor.from_array(idx)).numpy(), emb.weight.numpy()[idx])


def test_batchnorm_training_updates_running_stats_with_the_step(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bn = nn.BatchNorm2d(3, momentum=0.1)
    x, xr = _x(rng, 4, 3, 2, 2)
    y = bn(x)
    mean = xr.mean(axis=(0, 2, 3))
    var = xr.var(axis=(0, 2, 3))
    want = (xr - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    assert_close(y.numpy(), want, rtol=1e-4, atol=1e-5, what=f"seed={seed}")
    # nothing assigned until the step runs; then both statistics, in the step's graph run
    assert_close(bn.running_mean.numpy(), np.zeros(3))
    loss = (y * y).sum()
    loss.backward()
    SGD(bn.parameters(), lr=0.1).step()
    n = 16
    assert_close(bn.running_mean.numpy(), 0.1 * mean, rtol=RTOL, atol=ATOL, what=f"seed={seed}")
    assert_close(bn.running_var.numpy(), 0.9 + 0.1 * var * n / (n - 1), rtol=RTOL, atol=ATOL,
                 what=f"seed={seed}")
    bn.eval()
    rm, rv = _f64(bn.running_mean), _f64(bn.running_var)
    w, b = _f64(bn.weight), _f64(bn.bias)  # type: ignore[arg-type]
    want_eval = ((xr - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + 1e-5)
                 * w[None, :, None, None] + b[None, :, None, None])
    assert_close(bn(x).numpy(), want_eval, rtol=1e-4, atol=1e-5, what=f"seed={seed}")
    with pytest.raises(ShapeError, match=r"BatchNorm2d\(3\).*\(4, 2, 2, 2\)"):
        bn(Tensor.from_array(np.zeros((4, 2, 2, 2), np.float32)))
    flush_pending_updates()  # nothing left pending for other tests


def test_module_errors() -> None:
    with pytest.raises(TypeError, match="argument 1 is a int"):
        nn.Sequential(nn.ReLU(), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="groups=2"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        nn.Dropout(1.0)
    with pytest.raises(TypeError, match="floating point"):
        nn.Parameter(np.zeros(2, np.int64))
    with pytest.raises(ShapeError, match=r"inner dimensions differ: \(4, 5\) @ \(4, 3\)"):
        nn.Linear(4, 3)(Tensor.from_array(np.zeros((4, 5), np.float32)))
