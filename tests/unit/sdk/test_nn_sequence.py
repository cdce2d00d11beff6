"""LSTM, MultiheadAttention and the Transformer encoder against PyTorch's: torch's weights
copied in through ``load_state_dict`` (so the names match torch's too), fresh random
inputs, forward values and parameter gradients compared; train/eval behaviour."""

from __future__ import annotations

import numpy as np
import pytest

import triplane as tp
from triplane.sdk import nn
from triplane.sdk.tensor import Tensor
from triplane.testing import assert_close

pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")
torch = pytest.importorskip("torch", reason="PyTorch is not installed (it is the oracle here)")

# float32 on both sides; sums of a few hundred terms through tanh/softmax/layer_norm
FWD_RTOL, FWD_ATOL = 1e-4, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-4


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def _copy(ours: nn.Module, theirs: torch.nn.Module) -> None:
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})


def _compare(ours: nn.Module, theirs: torch.nn.Module, our_out: Tensor, their_out: torch.Tensor,
             proj: np.ndarray, what: str) -> None:
    """Forward values, then the gradient of sum(out * proj) w.r.t. every parameter."""
    assert_close(our_out.numpy(), their_out.detach().numpy(), rtol=FWD_RTOL, atol=FWD_ATOL,
                 what=f"{what} forward")
    (their_out * torch.from_numpy(proj)).sum().backward()
    ours.zero_grad()
    (our_out * Tensor.from_array(proj)).sum().backward()
    theirs_p = dict(theirs.named_parameters())
    names = [n for n, _ in ours.named_parameters()]
    assert sorted(names) == sorted(theirs_p), "parameter names differ from torch's"
    for name, p in ours.named_parameters():
        assert p.grad is not None, f"{what}: no gradient for {name}"
        assert_close(p.grad.numpy(), theirs_p[name].grad.numpy(), rtol=GRAD_RTOL, atol=GRAD_ATOL,
                     what=f"{what} grad {name}")


@pytest.mark.parametrize("batch_first,layers", [(False, 1), (True, 2)])
def test_lstm_matches_torch(seed: int, batch_first: bool, layers: int) -> None:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    theirs = torch.nn.LSTM(3, 5, num_layers=layers, batch_first=batch_first)
    ours = nn.LSTM(3, 5, num_layers=layers, batch_first=batch_first)
    _copy(ours, theirs)
    x = rng.standard_normal((2, 4, 3) if batch_first else (4, 2, 3)).astype(np.float32)
    h0 = rng.standard_normal((layers, 2, 5)).astype(np.float32)
    c0 = rng.standard_normal((layers, 2, 5)).astype(np.float32)
    out, (hn, cn) = ours(Tensor.from_array(x), (h0, c0))
    tout, (thn, tcn) = theirs(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    assert out.shape == tuple(tout.shape)
    for a, b, name in ((hn, thn, "h_n"), (cn, tcn, "c_n")):
        assert_close(a.numpy(), b.detach().numpy(), rtol=FWD_RTOL, atol=FWD_ATOL, what=f"seed={seed} {name}")
    proj = rng.standard_normal(out.shape).astype(np.float32)
    _compare(ours, theirs, out, tout, proj, f"seed={seed} LSTM")


def test_lstm_default_state_and_init_bounds(seed: int) -> None:
    tp.manual_seed(seed % 1000)
    lstm = nn.LSTM(4, 6)
    assert np.all(np.abs(lstm.weight_hh_l0.numpy()) <= 1 / np.sqrt(6))
    torch_lstm = torch.nn.LSTM(4, 6)
    _copy(lstm, torch_lstm)
    x = np.random.default_rng(seed).standard_normal((3, 2, 4)).astype(np.float32)
    out, (hn, _) = lstm(x)
    assert out.shape == (3, 2, 6) and hn.shape == (1, 2, 6)
    assert_close(out.numpy(), torch_lstm(torch.from_numpy(x))[0].detach().numpy(), rtol=FWD_RTOL,
                 atol=FWD_ATOL, what=f"seed={seed} zero state")
    with pytest.raises(tp.ShapeError, match="input=4"):
        lstm(np.zeros((3, 2, 5), np.float32))


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_matches_torch_with_masks(seed: int, batch_first: bool) -> None:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    n, length, src, e, heads = 2, 3, 4, 8, 2
    theirs = torch.nn.MultiheadAttention(e, heads, batch_first=batch_first)
    ours = nn.MultiheadAttention(e, heads, batch_first=batch_first)
    _copy(ours, theirs)

    def arr(t: int) -> np.ndarray:
        return rng.standard_normal((n, t, e) if batch_first else (t, n, e)).astype(np.float32)

    q, k, v = arr(length), arr(src), arr(src)
    padding = np.zeros((n, src), bool)
    padding[1, -2:] = True  # the second sequence has two padded keys
    attn = rng.standard_normal((length, src)).astype(np.float32)  # a float mask, added
    out, w = ours(q, k, v, key_padding_mask=padding, attn_mask=attn)
    tout, tw = theirs(*(torch.from_numpy(a) for a in (q, k, v)), key_padding_mask=torch.from_numpy(padding),
                      attn_mask=torch.from_numpy(attn))
    assert w is not None and w.shape == (n, length, src)
    assert_close(w.numpy(), tw.detach().numpy(), rtol=FWD_RTOL, atol=FWD_ATOL, what=f"seed={seed} weights")
    assert np.all(w.numpy()[1, :, -2:] == 0), "padded keys must get no weight"
    proj = rng.standard_normal(out.shape).astype(np.float32)
    _compare(ours, theirs, out, tout, proj, f"seed={seed} MHA")


def test_multihead_attention_bool_mask_and_errors(seed: int) -> None:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    theirs = torch.nn.MultiheadAttention(4, 1, batch_first=True)
    ours = nn.MultiheadAttention(4, 1, batch_first=True)
    _copy(ours, theirs)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    causal = nn.attention.causal_mask(3)
    out, w = ours(x, x, x, attn_mask=causal, average_attn_weights=False)
    assert w is not None and w.shape == (2, 1, 3, 3)
    tout, tw = theirs(*(torch.from_numpy(x),) * 3, attn_mask=torch.from_numpy(causal),
                      average_attn_weights=False)
    assert_close(w.numpy(), tw.detach().numpy(), rtol=FWD_RTOL, atol=FWD_ATOL, what=f"seed={seed} weights")
    assert np.all(np.triu(w.numpy()[0, 0], 1) == 0)
    assert_close(out.numpy(), tout.detach().numpy(), rtol=FWD_RTOL, atol=FWD_ATOL, what=f"seed={seed}")
    with pytest.raises(tp.ShapeError, match="key_padding_mask"):
        ours(x, x, x, key_padding_mask=np.zeros((2, 5), bool))
    with pytest.raises(ValueError, match="divisible"):
        nn.MultiheadAttention(6, 4)


@pytest.mark.parametrize("norm_first,batch_first,activation", [(False, False, "relu"), (True, True, "gelu")])
def test_transformer_encoder_layer_matches_torch(seed: int, norm_first: bool, batch_first: bool,
                                                 activation: str) -> None:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    kw = dict(dim_feedforward=16, dropout=0.2, activation=activation, batch_first=batch_first,
              norm_first=norm_first)
    theirs = torch.nn.TransformerEncoderLayer(8, 2, **kw).eval()
    ours = nn.TransformerEncoderLayer(8, 2, **kw).eval()
    _copy(ours, theirs)
    x = rng.standard_normal((2, 5, 8) if batch_first else (5, 2, 8)).astype(np.float32)
    padding = np.zeros((2, 5), bool)
    padding[0, -1] = True
    out = ours(x, src_key_padding_mask=padding, is_causal=True)
    tout = theirs(torch.from_numpy(x), src_mask=torch.nn.Transformer.generate_square_subsequent_mask(5),
                  src_key_padding_mask=torch.from_numpy(padding), is_causal=True)
    proj = rng.standard_normal(out.shape).astype(np.float32)
    _compare(ours, theirs, out, tout, proj, f"seed={seed} encoder layer")


def test_transformer_dropout_train_and_eval(seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((4, 3, 8)).astype(np.float32)
    tp.manual_seed(seed % 1000)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.5)
    assert layer.training
    a, b = layer(x).numpy(), layer(x).numpy()
    assert not np.allclose(a, b), "training: each call draws a new dropout mask"
    layer.eval()
    e1, e2 = layer(x).numpy(), layer(x).numpy()
    np.testing.assert_array_equal(e1, e2)
    assert not np.allclose(a, e1)
    # with dropout 0 the training forward is torch's training forward
    torch.manual_seed(seed)
    theirs = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    ours = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    _copy(ours, theirs)
    assert_close(ours(x).numpy(), theirs(torch.from_numpy(x)).detach().numpy(), rtol=FWD_RTOL,
                 atol=FWD_ATOL, what=f"seed={seed} train p=0")


def test_transformer_encoder_stacks_copies(seed: int) -> None:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8))
    sd = enc.state_dict()
    np.testing.assert_array_equal(sd["layers.0.linear1.weight"], sd["layers.1.linear1.weight"])
    theirs = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True), 2,
        norm=torch.nn.LayerNorm(8), enable_nested_tensor=False)
    assert sorted(sd) == sorted(theirs.state_dict())
    _copy(enc, theirs)
    x = np.random.default_rng(seed).standard_normal((2, 5, 8)).astype(np.float32)
    assert_close(enc(x).numpy(), theirs(torch.from_numpy(x)).detach().numpy(), rtol=FWD_RTOL,
                 atol=FWD_ATOL, what=f"seed={seed} encoder")
