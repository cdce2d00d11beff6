"""Attention and the Transformer encoder: :class:`MultiheadAttention`,
:class:`TransformerEncoderLayer` and :class:`TransformerEncoder`, torch's layouts,
parameter names and masking rules, so a torch ``state_dict`` loads into them as it is.

Masks follow torch: a boolean mask is True where attention is *not* allowed (the score
becomes -inf); a float mask is added to the scores. A query row whose every key is masked
gives NaN, as in torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import ShapeError
from triplane.sdk import shape as _shape
from triplane.sdk.elementwise import where
from triplane.sdk.nn import functional as F
from triplane.sdk.nn.modules import Dropout, LayerNorm, Linear, Module, Parameter, _init_rng
from triplane.sdk.tensor import Tensor, as_tensor

__all__ = ["MultiheadAttention", "TransformerEncoder", "TransformerEncoderLayer"]


def _additive(mask: Any, like: Tensor, what: str) -> Tensor:
    """A mask as a float tensor to add to the scores (bool True -> -inf)."""
    m = as_tensor(mask)
    if m.dtype == dt.dtype("bool"):
        return where(m, float("-inf"), 0.0).astype(like.dtype)
    if not m.dtype.is_float:
        raise TypeError(f"MultiheadAttention: {what} must be bool or floating point, not {m.dtype.name}")
    return m.astype(like.dtype)


def causal_mask(size: int) -> np.ndarray:
    """(size, size) bool, True above the diagonal: position i may not attend to j > i."""
    return np.triu(np.ones((size, size), dtype=bool), k=1)


class MultiheadAttention(Module):
    """Multi-head scaled dot-product attention (torch's ``nn.MultiheadAttention`` with
    ``kdim = vdim = embed_dim``).

    Parameters: ``in_proj_weight`` (3E, E) (Xavier-uniform), ``in_proj_bias`` (3E,) (zeros)
    and ``out_proj`` (a Linear E -> E, bias zeros). ``dropout`` applies to the attention
    weights in training only.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True)`` takes (L, N, E) / (S, N, E) inputs, or (N, L, E) /
    (N, S, E) with ``batch_first``; ``key_padding_mask`` is (N, S), True (or -inf) for
    keys to ignore; ``attn_mask`` is (L, S) or (N * num_heads, L, S). It returns
    ``(output, weights)``: output shaped like the query, weights (N, L, S) averaged over
    heads ((N, num_heads, L, S) when not averaged), or None without ``need_weights``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, dtype: Any = "float32") -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim={embed_dim} is not divisible by "
                             f"num_heads={num_heads}")
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self.head_dim = embed_dim // num_heads
        d = dt.dtype(dtype).np
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))  # xavier_uniform over (3E, E)
        w = _init_rng().uniform(-bound, bound, (3 * embed_dim, embed_dim))
        self.in_proj_weight = Parameter(w.astype(d))
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, d)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if bias:
            self.out_proj.bias = Parameter(np.zeros(embed_dim, d))
        self.dropout = Dropout(dropout)

    def _project(self, x: Tensor, i: int) -> Tensor:
        e = self.embed_dim
        y = x @ self.in_proj_weight[i * e:(i + 1) * e].T
        return y + self.in_proj_bias[i * e:(i + 1) * e] if self.in_proj_bias is not None else y

    def _heads(self, x: Tensor) -> Tensor:
        """(N, T, E) -> (N, heads, T, head_dim)."""
        n, t, _ = x.shape
        return _shape.transpose(x.reshape(n, t, self.num_heads, self.head_dim), (0, 2, 1, 3))

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None,
                average_attn_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
        for name, t in (("query", q), ("key", k), ("value", v)):
            if t.ndim != 3 or t.shape[2] != self.embed_dim:
                layout = "(N, L, E)" if self.batch_first else "(L, N, E)"
                raise ShapeError(f"MultiheadAttention: {name} must be {layout} with E={self.embed_dim}, "
                                 f"got {t.shape}")
        if not self.batch_first:  # work in (N, T, E)
            q, k, v = (_shape.transpose(t, (1, 0, 2)) for t in (q, k, v))
        if k.shape != v.shape or k.shape[0] != q.shape[0]:
            raise ShapeError(f"MultiheadAttention: key {k.shape} and value {v.shape} must match, "
                             f"with query's batch {q.shape[0]}")
        n, length, src = q.shape[0], q.shape[1], k.shape[1]
        qh = self._heads(self._project(q, 0)) * (1.0 / math.sqrt(self.head_dim))
        kh, vh = self._heads(self._project(k, 1)), self._heads(self._project(v, 2))
        scores = qh @ _shape.transpose(kh, (0, 1, 3, 2))  # (N, heads, L, S)
        if attn_mask is not None:
            m = _additive(attn_mask, scores, "attn_mask")
            if m.shape == (length, src):
                scores = scores + m
            elif m.shape == (n * self.num_heads, length, src):
                scores = scores + m.reshape(n, self.num_heads, length, src)
            else:
                raise ShapeError(f"MultiheadAttention: attn_mask must be {(length, src)} or "
                                 f"{(n * self.num_heads, length, src)}, got {m.shape}")
        if key_padding_mask is not None:
            m = _additive(key_padding_mask, scores, "key_padding_mask")
            if m.shape != (n, src):
                raise ShapeError(f"MultiheadAttention: key_padding_mask must be {(n, src)}, got {m.shape}")
            scores = scores + m.reshape(n, 1, 1, src)
        weights = F.softmax(scores, -1)
        out = self.dropout(weights) @ vh  # (N, heads, L, head_dim)
        out = self.out_proj(_shape.transpose(out, (0, 2, 1, 3)).reshape(n, length, self.embed_dim))
        if not self.batch_first:
            out = _shape.transpose(out, (1, 0, 2))
        if not need_weights:
            return out, None
        return out, weights.mean(axis=1) if average_attn_weights else weights

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block, each with a residual connection and a
    LayerNorm: after the residual (post-norm, torch's default) or, with ``norm_first``,
    before the block. ``dropout`` applies to the attention weights, inside the
    feed-forward block and to each block's output, in training only.

    Submodules carry torch's names (``self_attn``, ``linear1``, ``linear2``, ``norm1``,
    ``norm2``), so a torch ``state_dict`` loads as it is. ``forward(src, src_mask=None,
    src_key_padding_mask=None, is_causal=False)``; ``is_causal`` without a mask masks
    every later position.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 dtype: Any = "float32") -> None:
        super().__init__()
        if isinstance(activation, str) and activation not in _ACTIVATIONS:
            raise ValueError(f"TransformerEncoderLayer: activation {activation!r} is unknown "
                             f"(known: {sorted(_ACTIVATIONS)}, or pass a function)")
        self._config = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward,
                            dropout=dropout, activation=activation, layer_norm_eps=layer_norm_eps,
                            batch_first=batch_first, norm_first=norm_first, bias=bias, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        self._activation = _ACTIVATIONS[activation] if isinstance(activation, str) else activation

    def _sa(self, x: Tensor, mask: Any, padding: Any) -> Tensor:
        return self.dropout1(self.self_attn(x, x, x, key_padding_mask=padding, attn_mask=mask,
                                            need_weights=False)[0])

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self._activation(self.linear1(x)))))

    def forward(self, src: Any, src_mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool = False) -> Tensor:
        x = as_tensor(src)
        if is_causal and src_mask is None:
            src_mask = causal_mask(x.shape[1] if self.self_attn.batch_first else x.shape[0])
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask))
        return self.norm2(x + self._ff(x))

    def clone(self) -> TransformerEncoderLayer:
        """A new layer of the same configuration holding copies of this one's values."""
        twin = TransformerEncoderLayer(**self._config)
        twin.load_state_dict(self.state_dict())
        return twin.train(self.training)  # type: ignore[return-value]


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (equal values at the start, as torch's
    deep copies) applied in order, then ``norm`` if given. Parameter names
    ``layers.{i}.*`` and ``norm.*`` as torch's."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int,
                 norm: Module | None = None) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"TransformerEncoder: num_layers must be at least 1, got {num_layers}")
        self.layers = [encoder_layer.clone() for _ in range(num_layers)]
        self.norm = norm

    def forward(self, src: Any, mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool = False) -> Tensor:
        x = as_tensor(src)
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        return self.norm(x) if self.norm is not None else x
