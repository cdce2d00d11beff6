"""Kernels of the elementwise ops."""

from __future__ import annotations

import numpy as np

from triplane.engines.op.numpy_engine import kernel

_UNARY = {"neg": np.negative, "exp": np.exp, "log": np.log}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply}

for _name, _fn in _UNARY.items():
    kernel(_name)(lambda ins, a, out, _fn=_fn: _fn(ins[0]))
for _name, _fn in _BINARY.items():
    kernel(_name)(lambda ins, a, out, _fn=_fn: _fn(ins[0], ins[1]))


@kernel("div")
def _div(ins, a, out):
    x, y = ins
    if out.dtype.is_int:
        # C-style truncating division would differ by engine; the IR means floor division
        # for integers, and division by zero is a user error.
        if np.any(y == 0):
            raise ZeroDivisionError("integer division by zero")
        return np.floor_divide(x, y)
    return np.true_divide(x, y)


@kernel("cast")
def _cast(ins, a, out):
    return ins[0].astype(out.dtype.np)
