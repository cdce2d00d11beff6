"""Recurrent layers: :class:`LSTM`, torch's layout and parameter names.

The time loop is unrolled into the graph when ``forward`` records it (a sequence of T steps
is T cells of a few ops each), so the compiled step of a fixed sequence length is cached
like any other; a new length records a new graph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import ShapeError
from triplane.sdk import shape as _shape
from triplane.sdk.elementwise import sigmoid, tanh
from triplane.sdk.nn.modules import Module, Parameter, _init_rng
from triplane.sdk.tensor import Tensor, as_tensor

__all__ = ["LSTM"]


class LSTM(Module):
    """A multi-layer LSTM over ``(T, N, input_size)`` (``(N, T, input_size)`` with
    ``batch_first``), torch's equations and gate order (input, forget, cell, output).

    Parameters per layer ``k``: ``weight_ih_l{k}`` (4H, in), ``weight_hh_l{k}`` (4H, H)
    and, with ``bias``, ``bias_ih_l{k}`` and ``bias_hh_l{k}`` (4H,), all uniform in
    +-1/sqrt(H) as torch initialises them, so torch's ``state_dict`` loads as it is.
    ``dropout`` applies to the outputs of every layer but the last, in training only.

    ``forward(x, (h0, c0)=None)`` returns ``(output, (h_n, c_n))``: ``output`` holds the
    last layer's hidden state at every step, ``h_n``/``c_n`` are (num_layers, N, H).
    Unbatched input (T, input_size) is not supported: add a batch axis of 1.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, dtype: Any = "float32") -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"LSTM: num_layers must be at least 1, got {num_layers}")
        if not 0 <= dropout < 1:
            raise ValueError(f"LSTM: dropout must be in [0, 1), got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.batch_first, self.dropout, self.bias = batch_first, dropout, bias
        rng = _init_rng()
        bound = 1.0 / math.sqrt(hidden_size)
        d = dt.dtype(dtype).np
        for k in range(num_layers):
            fan_in = input_size if k == 0 else hidden_size
            shapes = {f"weight_ih_l{k}": (4 * hidden_size, fan_in),
                      f"weight_hh_l{k}": (4 * hidden_size, hidden_size)}
            if bias:
                shapes |= {f"bias_ih_l{k}": (4 * hidden_size,), f"bias_hh_l{k}": (4 * hidden_size,)}
            for name, shape in shapes.items():
                setattr(self, name, Parameter(rng.uniform(-bound, bound, size=shape).astype(d)))
        from triplane.sdk.nn.modules import Dropout

        self._drop = Dropout(dropout) if dropout and num_layers > 1 else None

    def _layer(self, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
        w_ih, w_hh = getattr(self, f"weight_ih_l{k}"), getattr(self, f"weight_hh_l{k}")
        b = getattr(self, f"bias_ih_l{k}") + getattr(self, f"bias_hh_l{k}") if self.bias else None
        return w_ih, w_hh, b

    def forward(self, x: Any, hx: tuple[Any, Any] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        x = as_tensor(x)
        if x.ndim != 3 or x.shape[2] != self.input_size:
            want = "(N, T, input)" if self.batch_first else "(T, N, input)"
            raise ShapeError(f"LSTM({self.input_size}, {self.hidden_size}) needs input {want} with "
                             f"input={self.input_size}, got {x.shape}")
        if self.batch_first:
            x = _shape.transpose(x, (1, 0, 2))
        steps, n = x.shape[0], x.shape[1]
        h_size, layers = self.hidden_size, self.num_layers
        if hx is None:
            zeros = Tensor.from_array(np.zeros((layers, n, h_size), x.dtype.np))
            h0, c0 = zeros, zeros
        else:
            h0, c0 = as_tensor(hx[0]), as_tensor(hx[1])
            for name, t in (("h0", h0), ("c0", c0)):
                if t.shape != (layers, n, h_size):
                    raise ShapeError(f"LSTM: {name} must be {(layers, n, h_size)} "
                                     f"(num_layers, N, hidden), got {t.shape}")
        if self._drop is not None:  # private, so train()/eval() do not reach it
            self._drop.train(self.training)
        hs, cs = [], []
        seq = x
        for k in range(layers):
            w_ih, w_hh, b = self._layer(k)
            # the input projection of every step at once: one matmul instead of T
            xw = seq @ w_ih.T
            if b is not None:
                xw = xw + b
            h, c = h0[k], c0[k]
            outs = []
            for t in range(steps):
                gates = xw[t] + h @ w_hh.T
                i = sigmoid(gates[:, 0:h_size])
                f = sigmoid(gates[:, h_size:2 * h_size])
                g = tanh(gates[:, 2 * h_size:3 * h_size])
                o = sigmoid(gates[:, 3 * h_size:])
                c = f * c + i * g
                h = o * tanh(c)
                outs.append(h)
            hs.append(h)
            cs.append(c)
            seq = _shape.stack(outs, 0)
            if self._drop is not None and k < layers - 1:
                seq = self._drop(seq)
        out = _shape.transpose(seq, (1, 0, 2)) if self.batch_first else seq
        return out, (_shape.stack(hs, 0), _shape.stack(cs, 0))

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, dropout={self.dropout}")
