"""LSTM and MultiheadAttention forward values against plain numpy references, so the
sequence models are checked where PyTorch is not installed too (test_nn_sequence.py
compares them, gradients included, with torch's)."""

from __future__ import annotations

import numpy as np
import pytest

import triplane as tp
from triplane.sdk import nn
from triplane.testing import assert_close

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def test_lstm_matches_its_equations(seed: int) -> None:
    tp.manual_seed(seed % 1000)
    lstm = nn.LSTM(3, 4, batch_first=True)
    p = {k: v.astype(np.float64) for k, v in lstm.state_dict().items()}
    x = np.random.default_rng(seed).standard_normal((2, 5, 3)).astype(np.float32)
    h, c = np.zeros((2, 4)), np.zeros((2, 4))
    outs = []
    for t in range(5):
        g = x[:, t] @ p["weight_ih_l0"].T + p["bias_ih_l0"] + h @ p["weight_hh_l0"].T + p["bias_hh_l0"]
        i, f, gg, o = _sigmoid(g[:, :4]), _sigmoid(g[:, 4:8]), np.tanh(g[:, 8:12]), _sigmoid(g[:, 12:])
        c = f * c + i * gg
        h = o * np.tanh(c)
        outs.append(h)
    out, (hn, cn) = lstm(x)
    assert_close(out.numpy(), np.stack(outs, 1), rtol=RTOL, atol=ATOL, what=f"seed={seed} output")
    assert_close(hn.numpy()[0], h, rtol=RTOL, atol=ATOL, what=f"seed={seed} h_n")
    assert_close(cn.numpy()[0], c, rtol=RTOL, atol=ATOL, what=f"seed={seed} c_n")


def test_multihead_attention_matches_its_equations(seed: int) -> None:
    tp.manual_seed(seed % 1000)
    e, heads = 6, 2
    attn = nn.MultiheadAttention(e, heads, batch_first=True)
    p = {k: v.astype(np.float64) for k, v in attn.state_dict().items()}
    p["in_proj_bias"] = np.random.default_rng(seed).standard_normal(3 * e)  # not the zeros of init
    attn.load_state_dict({k: v.astype(np.float32) for k, v in p.items()})
    x = np.random.default_rng(seed + 1).standard_normal((2, 4, e)).astype(np.float32)
    padding = np.array([[False] * 4, [False, False, True, True]])
    q, k, v = (x @ p["in_proj_weight"][i * e:(i + 1) * e].T + p["in_proj_bias"][i * e:(i + 1) * e]
               for i in range(3))
    out = np.zeros((2, 4, e))
    weights = np.zeros((2, 4, 4))
    for h in range(heads):
        s = slice(h * 3, (h + 1) * 3)
        scores = q[:, :, s] @ k[:, :, s].transpose(0, 2, 1) / np.sqrt(3)
        scores = np.where(padding[:, None, :], -np.inf, scores)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out[:, :, s] = w @ v[:, :, s]
        weights += w / heads
    want = out @ p["out_proj.weight"].T + p["out_proj.bias"]
    got, got_w = attn(x, x, x, key_padding_mask=padding)
    assert got_w is not None
    assert_close(got.numpy(), want, rtol=RTOL, atol=ATOL, what=f"seed={seed} output")
    assert_close(got_w.numpy(), weights, rtol=RTOL, atol=ATOL, what=f"seed={seed} weights")
