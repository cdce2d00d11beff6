"""Kernels of the reductions.

Floating-point sums accumulate in at least float32 (float16 and bfloat16 results are
rounded once, at the end), so a long float16 sum is not a chain of float16 roundings.
"""

from __future__ import annotations

import math

import numpy as np

from triplane.engines.op.numpy_kernels.table import KernelGroup

KERNEL_GROUP = KernelGroup()  # registered by numpy_kernels.register_all
kernel = KERNEL_GROUP.kernel


def axes_of(a, x=None):
    # A 0-d tensor has no axes to name; the op table accepts axis 0/-1 on it (as torch does).
    if a["axes"] is None or (x is not None and x.ndim == 0):
        return None
    return tuple(a["axes"])


def _acc(out):
    """The dtype to accumulate in for a result of type ``out``."""
    if out.dtype.is_float:
        return np.float64 if out.dtype.name == "float64" else np.float32
    return out.dtype.np


def _count(x, a):
    axes = axes_of(a, x)
    return math.prod(x.shape[i] for i in (range(x.ndim) if axes is None else axes))


@kernel("sum")
def _sum(ins, a, out):
    return np.sum(ins[0], axis=axes_of(a, ins[0]), keepdims=a["keepdims"], dtype=_acc(out))


@kernel("prod")
def _prod(ins, a, out):
    return np.prod(ins[0], axis=axes_of(a, ins[0]), keepdims=a["keepdims"], dtype=_acc(out))


@kernel("max")
def _max(ins, a, out):
    return np.max(ins[0], axis=axes_of(a, ins[0]), keepdims=a["keepdims"])


@kernel("min")
def _min(ins, a, out):
    return np.min(ins[0], axis=axes_of(a, ins[0]), keepdims=a["keepdims"])


@kernel("mean")
def _mean(ins, a, out):
    # sum / count rather than np.mean: over nothing this is 0/0 = nan without numpy's warning.
    x = ins[0]
    s = np.sum(x, axis=axes_of(a, ins[0]), keepdims=a["keepdims"], dtype=_acc(out))
    return np.true_divide(s, _count(x, a))


@kernel("var")
def _var(ins, a, out):
    x = ins[0].astype(_acc(out), copy=False)
    axes = axes_of(a, x)
    mean = np.mean(x, axis=axes, keepdims=True)
    sq = np.sum(np.square(x - mean), axis=axes, keepdims=a["keepdims"])
    return sq / (_count(x, a) - a["ddof"])


@kernel("logsumexp")
def _logsumexp(ins, a, out):
    x = ins[0].astype(_acc(out), copy=False)
    axes = axes_of(a, x)
    if _count(x, a) == 0 or x.size == 0:
        return np.full(out.shape, -np.inf)
    m = np.max(x, axis=axes, keepdims=True)
    # Shift by the max so exp never overflows; an infinite max (all -inf, or +inf present)
    # is not subtracted, so the result is that infinity rather than nan.
    m = np.where(np.isfinite(m), m, 0)
    s = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return s if a["keepdims"] else s.reshape(out.shape)


@kernel("argmax")
def _argmax(ins, a, out):
    return np.argmax(ins[0], axis=a["axis"], keepdims=a["keepdims"])


@kernel("argmin")
def _argmin(ins, a, out):
    return np.argmin(ins[0], axis=a["axis"], keepdims=a["keepdims"])
