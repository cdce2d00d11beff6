"""Kernels of the shape ops (views where numpy allows)."""

from __future__ import annotations

import numpy as np

from triplane.engines.op.numpy_engine import kernel


@kernel("reshape")
def _reshape(ins, a, out):
    return ins[0].reshape(out.shape)


@kernel("transpose")
def _transpose(ins, a, out):
    return np.transpose(ins[0], a["perm"])


@kernel("broadcast_to")
def _broadcast_to(ins, a, out):
    return np.broadcast_to(ins[0], out.shape)
