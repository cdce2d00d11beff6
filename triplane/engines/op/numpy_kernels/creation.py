"""Kernels of the creation ops."""

from __future__ import annotations

import base64

import numpy as np

from triplane.engines.op.numpy_engine import kernel


@kernel("full")
def _full(ins, a, out):
    return np.full(out.shape, a["value"], dtype=out.dtype.np)


@kernel("constant")
def _constant(ins, a, out):
    raw = base64.b64decode(a["data"])
    return np.frombuffer(raw, dtype=out.dtype.np.newbyteorder("<")).astype(out.dtype.np).reshape(out.shape)


@kernel("input")
def _input(ins, a, out):
    # Host data is bound by the runtime, never computed; reaching here is a runtime bug.
    raise LookupError(f"input tensor {a['tensor']!r} was not bound")
