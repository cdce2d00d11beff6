"""Kernels of the shape ops (views where numpy allows)."""

from __future__ import annotations

import builtins

import numpy as np

from triplane.engines.op.numpy_kernels.table import KernelGroup
from triplane.proto.errors import KernelError

KERNEL_GROUP = KernelGroup()  # registered by numpy_kernels.register_all
kernel = KERNEL_GROUP.kernel


@kernel("reshape", "squeeze", "unsqueeze")
def _reshape(ins, a, out):
    return ins[0].reshape(out.shape)


@kernel("transpose")
def _transpose(ins, a, out):
    return np.transpose(ins[0], a["perm"])


@kernel("broadcast_to")
def _broadcast_to(ins, a, out):
    return np.broadcast_to(ins[0], out.shape)


@kernel("concat")
def _concat(ins, a, out):
    return np.concatenate(ins, axis=a["axis"])


@kernel("stack")
def _stack(ins, a, out):
    return np.stack(ins, axis=a["axis"])


def _index(a):
    return tuple(builtins.slice(lo, hi, st) for lo, hi, st in zip(a["starts"], a["stops"], a["steps"]))


@kernel("slice")
def _slice(ins, a, out):
    return ins[0][_index(a)]


@kernel("unslice")
def _unslice(ins, a, out):
    result = np.zeros(out.shape, dtype=ins[0].dtype)
    result[_index(a)] = ins[0]
    return result


def _checked_index(idx, dim, op):
    """Indices as intp, wrapped from [-dim, dim) to [0, dim); anything else is the user's error."""
    idx = np.asarray(idx)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        bad = idx[(idx < -dim) | (idx >= dim)].reshape(-1)[0]
        raise KernelError(f"index {int(bad)} is out of range for an axis of size {dim} "
                          f"(valid: {-dim} .. {dim - 1})", op=op)
    return np.where(idx < 0, idx + dim, idx).astype(np.intp)


@kernel("gather")
def _gather(ins, a, out):
    x, idx = ins
    ax = a["axis"] % x.ndim
    return np.take(x, _checked_index(idx, x.shape[ax], "gather"), axis=ax)


@kernel("scatter_add")
def _scatter_add(ins, a, out):
    g, idx = ins
    ax, size = a["axis"], a["size"]
    idx = _checked_index(idx, size, "scatter_add")
    result = np.zeros(out.shape, dtype=g.dtype)
    # Move the indexed axis first so one np.add.at call handles index arrays of any shape:
    # g's dims [ax, ax + idx.ndim) are the index's, the rest follow the result's order.
    moved = np.moveaxis(result, ax, 0)
    gm = np.moveaxis(g, list(range(ax, ax + idx.ndim)), list(range(idx.ndim)))
    np.add.at(moved, idx, gm)
    return result


@kernel("pad")
def _pad(ins, a, out):
    return np.pad(ins[0], [tuple(p) for p in a["pads"]], mode="constant", constant_values=a["value"])


@kernel("flip")
def _flip(ins, a, out):
    x = ins[0]
    if x.ndim == 0:
        return x
    return np.flip(x, axis=None if a["axes"] is None else tuple(a["axes"]))
