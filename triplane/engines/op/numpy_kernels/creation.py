"""Kernels of the creation ops."""

from __future__ import annotations

import base64

import numpy as np

from triplane.engines.op.numpy_kernels import random
from triplane.engines.op.numpy_kernels.table import KernelGroup

KERNEL_GROUP = KernelGroup()  # registered by numpy_kernels.register_all
kernel = KERNEL_GROUP.kernel


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


@kernel("arange")
def _arange(ins, a, out):
    (n,) = out.shape
    start, step = a["start"], a["step"]
    if out.dtype.is_int and start.is_integer() and step.is_integer():
        # exact integer arithmetic (float64 would round past 2**53)
        return np.arange(int(start), int(start) + n * int(step), int(step), dtype=np.int64)[:n]
    return start + step * np.arange(n, dtype=np.float64)


@kernel("eye")
def _eye(ins, a, out):
    n, m = out.shape
    return np.eye(n, m, a["k"], dtype=out.dtype.np)


def _draw(a, shape, contiguous, at):
    """Random numbers for the node's elements: the region full_shape/start when set (a
    tile of a larger random tensor), else the whole tensor from ``offset``."""
    where = random.region_index(tuple(shape), a.get("full_shape"), a.get("start"), a["offset"])
    if isinstance(where, tuple):
        first, count = where
        return contiguous(a["seed"], count, first).reshape(shape)
    return at(a["seed"], where)


@kernel("uniform")
def _uniform(ins, a, out):
    u = _draw(a, out.shape, random.uniform01, random.uniform01_at)
    np.multiply(u, a["high"] - a["low"], out=u)  # low + (high - low) * u, in place
    return np.add(u, a["low"], out=u)


@kernel("normal")
def _normal(ins, a, out):
    z = _draw(a, out.shape, random.standard_normal, random.standard_normal_at)
    np.multiply(z, a["std"], out=z)  # mean + std * z, in place
    return np.add(z, a["mean"], out=z)
