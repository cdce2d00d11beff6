"""Kernels of the nn ops.

float16 inputs are computed in float32 (the engine rounds the result to the node's
dtype): softmax, losses and normalisation sum many terms and would lose too much in
half precision. Convolution is im2col (a strided view, no copy until the matmul) and
one matmul per group; pooling reads the same kind of window view.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from triplane.engines.op.numpy_kernels.random import region_index, uniform01, uniform01_at
from triplane.engines.op.numpy_kernels.table import KernelGroup
from triplane.proto.errors import KernelError

KERNEL_GROUP = KernelGroup()  # registered by numpy_kernels.register_all
kernel = KERNEL_GROUP.kernel


def _work(x: np.ndarray) -> np.ndarray:
    """x in the precision its computation needs: float64 stays, other floats go to float32."""
    return x if x.dtype == np.float64 else x.astype(np.float32)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    # The array methods, not np.max/np.sum: the same reductions without numpy's Python
    # dispatch (a third of a small batch's loss kernel).
    m = x.max(axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # a row of -inf stays -inf/nan rather than inf - inf
    z = x - m
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


@kernel("softmax")
def _softmax(ins, a, out):
    return np.exp(_log_softmax(_work(ins[0]), a["axis"]))


@kernel("log_softmax")
def _log_softmax_k(ins, a, out):
    return _log_softmax(_work(ins[0]), a["axis"])


# --- losses -------------------------------------------------------------------------------


def _reduce(loss: np.ndarray, reduction: str, count: float | None = None) -> np.ndarray:
    if reduction == "none":
        return loss
    total = np.sum(loss)
    return total if reduction == "sum" else total / (loss.size if count is None else count)


def _ce_parts(logits: np.ndarray, labels: np.ndarray, a):
    """Class-axis-last log-probabilities, the labels, the mask of counted labels, and
    their count. Raises KernelError on a label outside [0, C)."""
    x = _work(logits)
    x = np.moveaxis(x, 0, -1) if x.ndim == 1 else np.moveaxis(x, 1, -1)
    c = x.shape[-1]
    ignore = a["ignore_index"]
    keep = labels != ignore if ignore is not None else np.ones(labels.shape, dtype=bool)
    bad = keep & ((labels < 0) | (labels >= c))
    if np.any(bad):
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise KernelError(f"label {int(labels[pos])} at position {pos} is out of range for "
                          f"{c} classes (labels must be in [0, {c})"
                          + (f" or equal ignore_index={ignore})" if ignore is not None else ")"))
    safe = np.where(keep, labels, 0).astype(np.intp)
    return _log_softmax(x, -1), safe, keep, int(np.count_nonzero(keep))


def _ce_plain(logits: np.ndarray, labels: np.ndarray, a):
    """The common case's parts, with fewer passes: (N, C) logits, every label counted (no
    ignore_index), no label smoothing. Log-probabilities and the labels as indices, or
    None for any other case (or a label out of range, which ``_ce_parts`` reports)."""
    if logits.ndim != 2 or a["ignore_index"] is not None or a["label_smoothing"]:
        return None
    c = logits.shape[1]
    if labels.size and (labels.min() < 0 or labels.max() >= c):
        return None
    return _log_softmax(_work(logits), -1), labels.astype(np.intp, copy=False)


@kernel("cross_entropy")
def _cross_entropy(ins, a, out):
    plain = _ce_plain(ins[0], ins[1], a)
    if plain is not None:
        logp, labels = plain
        loss = -logp[np.arange(len(labels)), labels]
        if a["reduction"] == "none":
            return loss
        total = loss.sum()
        return total if a["reduction"] == "sum" else total / len(labels)
    logp, labels, keep, count = _ce_parts(ins[0], ins[1], a)
    picked = np.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    ls = a["label_smoothing"]
    loss = -(1.0 - ls) * picked - ls * np.mean(logp, axis=-1) if ls else -picked
    loss = np.where(keep, loss, 0.0)
    return _reduce(loss, a["reduction"], count)


@kernel("cross_entropy_grad")
def _cross_entropy_grad(ins, a, out):
    plain = _ce_plain(ins[0], ins[1], a)
    if plain is not None:  # the general path's values, with every label counted
        logp, labels = plain
        n = len(labels)
        d = np.exp(logp)
        rows = np.arange(n)
        d[rows, labels] -= 1.0
        g = _work(ins[2])
        if a["reduction"] == "mean":
            g = g / n if n else np.full_like(g, np.nan)
        d *= np.broadcast_to(g, (n,))[:, None]
        return d
    logp, labels, keep, count = _ce_parts(ins[0], ins[1], a)
    g = _work(ins[2])
    c = logp.shape[-1]
    ls = a["label_smoothing"]
    d = np.exp(logp) - ls / c
    np.put_along_axis(d, labels[..., None],
                      np.take_along_axis(d, labels[..., None], axis=-1) - (1.0 - ls), axis=-1)
    # per-label weight: the incoming gradient of its loss term
    if a["reduction"] == "mean":
        g = g / count if count else np.full_like(g, np.nan)
    w = np.where(keep, np.broadcast_to(g, keep.shape), 0.0)
    d = d * w[..., None]
    return np.moveaxis(d, -1, 0) if ins[0].ndim == 1 else np.moveaxis(d, -1, 1)


@kernel("mse_loss")
def _mse_loss(ins, a, out):
    d = _work(ins[0]) - _work(ins[1])
    return _reduce(d * d, a["reduction"])


# --- windows: conv2d and pooling ----------------------------------------------------------------


def _pad(x: np.ndarray, padding, value: float = 0.0) -> np.ndarray:
    ph, pw = padding
    if not ph and not pw:
        return x
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _windows(xp: np.ndarray, k, stride, dilation, out_hw) -> np.ndarray:
    """Read-only view (N, C, Ho, Wo, kH, kW) of the windows of padded input ``xp``."""
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    shape = (n, c, *out_hw, *k)
    strides = (sn, sc, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1])
    return as_strided(xp, shape, strides, writeable=False)


def _scatter_windows(dwin: np.ndarray, padded_hw, stride, dilation, padding) -> np.ndarray:
    """Adjoint of :func:`_windows` followed by cropping the padding: sum each window
    position's values (N, C, Ho, Wo, kH, kW) back into an (N, C, H, W) array."""
    n, c, ho, wo, kh, kw = dwin.shape
    dxp = np.zeros((n, c, *padded_hw), dtype=dwin.dtype)
    for p in range(kh):
        for q in range(kw):
            r0, c0 = p * dilation[0], q * dilation[1]
            dxp[:, :, r0:r0 + stride[0] * (ho - 1) + 1:stride[0],
                c0:c0 + stride[1] * (wo - 1) + 1:stride[1]] += dwin[..., p, q]
    ph, pw = padding
    return dxp[:, :, ph:padded_hw[0] - ph, pw:padded_hw[1] - pw]


def _conv_cols(x: np.ndarray, w_shape, a, out_hw) -> np.ndarray:
    """im2col: (G, N*Ho*Wo, C/G*kH*kW) rows of input windows."""
    g = a["groups"]
    xp = _pad(_work(x), a["padding"])
    win = _windows(xp, w_shape[2:], a["stride"], a["dilation"], out_hw)
    n, c = x.shape[:2]
    win = win.reshape(n, g, c // g, *out_hw, *w_shape[2:])
    return win.transpose(1, 0, 3, 4, 2, 5, 6).reshape(g, n * out_hw[0] * out_hw[1], -1)


def _bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched matmul as one 2-d BLAS call per group: np.matmul on 3-d stacks can miss
    BLAS and be ten times slower on the small matrices a CNN makes."""
    if a.shape[0] == 1:
        return (a[0] @ b[0])[None]
    return np.stack([a[i] @ b[i] for i in range(a.shape[0])])


def _grad_groups(gy: np.ndarray, groups: int) -> np.ndarray:
    """(N, O, Ho, Wo) -> (G, N*Ho*Wo, O/G), the layout of the im2col matmul's output."""
    n, o, ho, wo = gy.shape
    per = o // groups
    return gy.reshape(n, groups, per, ho, wo).transpose(1, 0, 3, 4, 2).reshape(groups, -1, per)


@kernel("conv2d")
def _conv2d(ins, a, out):
    x, w = ins
    g = a["groups"]
    n, o, ho, wo = out.shape
    cols = _conv_cols(x, w.shape, a, (ho, wo))
    wm = _work(w).reshape(g, o // g, -1).transpose(0, 2, 1)  # (G, C/G*kH*kW, O/G)
    y = _bmm(cols, wm)  # (G, N*Ho*Wo, O/G)
    return y.reshape(g, n, ho, wo, o // g).transpose(1, 0, 4, 2, 3).reshape(n, o, ho, wo)


@kernel("conv2d_grad_weight")
def _conv2d_grad_weight(ins, a, out):
    x, gy = ins
    g = a["groups"]
    cols = _conv_cols(x, out.shape, a, gy.shape[2:])
    gm = _grad_groups(_work(gy), g)  # (G, N*Ho*Wo, O/G)
    dw = _bmm(gm.transpose(0, 2, 1), cols)  # (G, O/G, C/G*kH*kW)
    return dw.reshape(out.shape)


@kernel("conv2d_grad_input")
def _conv2d_grad_input(ins, a, out):
    gy, w = ins
    g = a["groups"]
    n, c, h, wd = out.shape
    o, cg, kh, kw = w.shape
    ho, wo = gy.shape[2:]
    gm = _grad_groups(_work(gy), g)  # (G, N*Ho*Wo, O/G)
    wm = _work(w).reshape(g, o // g, cg * kh * kw)
    dcols = _bmm(gm, wm)  # (G, N*Ho*Wo, C/G*kH*kW)
    dwin = dcols.reshape(g, n, ho, wo, cg, kh, kw).transpose(1, 0, 4, 2, 3, 5, 6)
    dwin = dwin.reshape(n, c, ho, wo, kh, kw)
    ph, pw = a["padding"]
    return _scatter_windows(dwin, (h + 2 * ph, wd + 2 * pw), a["stride"], a["dilation"], (ph, pw))


def _pool_view(x: np.ndarray, a, out_hw, pad_value: float) -> np.ndarray:
    stride = a["stride"] or a["kernel"]
    return _windows(_pad(x, a["padding"], pad_value), a["kernel"], stride, (1, 1), out_hw)


@kernel("max_pool2d")
def _max_pool2d(ins, a, out):
    return _pool_view(ins[0], a, out.shape[2:], -np.inf).max(axis=(4, 5))


@kernel("avg_pool2d")
def _avg_pool2d(ins, a, out):
    kh, kw = a["kernel"]
    return _pool_view(_work(ins[0]), a, out.shape[2:], 0.0).sum(axis=(4, 5)) / (kh * kw)


@kernel("max_pool2d_grad")
def _max_pool2d_grad(ins, a, out):
    x, gy = ins
    kh, kw = a["kernel"]
    win = _pool_view(x, a, gy.shape[2:], -np.inf)
    first = np.argmax(win.reshape(*win.shape[:4], kh * kw), axis=-1)  # argmax: first on ties
    dwin = np.zeros((*win.shape[:4], kh * kw), dtype=_work(gy).dtype)
    np.put_along_axis(dwin, first[..., None], _work(gy)[..., None], axis=-1)
    ph, pw = a["padding"]
    padded = (x.shape[2] + 2 * ph, x.shape[3] + 2 * pw)
    return _scatter_windows(dwin.reshape(win.shape), padded, a["stride"] or a["kernel"], (1, 1), (ph, pw))


@kernel("avg_pool2d_grad")
def _avg_pool2d_grad(ins, a, out):
    gy = _work(ins[0])
    kh, kw = a["kernel"]
    dwin = np.broadcast_to((gy / (kh * kw))[..., None, None], (*gy.shape, kh, kw))
    ph, pw = a["padding"]
    padded = (out.shape[2] + 2 * ph, out.shape[3] + 2 * pw)
    return _scatter_windows(dwin, padded, a["stride"] or a["kernel"], (1, 1), (ph, pw))


# --- embedding, one_hot, dropout -------------------------------------------------------------


def _check_indices(idx: np.ndarray, n: int, what: str) -> np.ndarray:
    bad = (idx < 0) | (idx >= n)
    if np.any(bad):
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise KernelError(f"index {int(idx[pos])} at position {pos} is out of range for {what} "
                          f"(indices must be in [0, {n}))")
    return idx.astype(np.intp)


@kernel("embedding")
def _embedding(ins, a, out):
    w, idx = ins
    return w[_check_indices(idx, w.shape[0], f"an embedding of {w.shape[0]} rows")]


@kernel("embedding_grad")
def _embedding_grad(ins, a, out):
    idx, g = ins
    v = a["num_embeddings"]
    dw = np.zeros((v, g.shape[-1]), dtype=_work(g).dtype)
    np.add.at(dw, _check_indices(idx, v, f"an embedding of {v} rows").reshape(-1), g.reshape(-1, g.shape[-1]))
    return dw


@kernel("one_hot")
def _one_hot(ins, a, out):
    c = a["num_classes"]
    idx = _check_indices(ins[0], c, f"{c} classes")
    return idx[..., None] == np.arange(c)


@kernel("dropout")
def _dropout(ins, a, out):
    x = ins[0]
    p = a["p"]
    if not a["training"] or p == 0.0:
        return x
    # A tile (full_shape/start set) draws the same mask as its region of the whole tensor.
    where = region_index(x.shape, a.get("full_shape"), a.get("start"))
    u = uniform01(a["seed"], where[1], where[0]).reshape(x.shape) if isinstance(where, tuple) \
        else uniform01_at(a["seed"], where)
    keep = u >= p
    return np.where(keep, _work(x) * (1.0 / (1.0 - p)), 0.0).astype(_work(x).dtype)


# --- normalisation ------------------------------------------------------------------------------


def _normalise(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mean = np.mean(x, axis=axes, keepdims=True)
    xc = x - mean
    var = np.mean(xc * xc, axis=axes, keepdims=True)
    return xc / np.sqrt(var + eps)


@kernel("layer_norm")
def _layer_norm(ins, a, out):
    x, w, b = (_work(t) for t in ins)
    axes = tuple(range(x.ndim - a["normalized_ndim"], x.ndim))
    return _normalise(x, axes, a["eps"]) * w + b


@kernel("batch_norm")
def _batch_norm(ins, a, out):
    x, w, b, rmean, rvar = (_work(t) for t in ins)
    cshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if a["training"]:
        xhat = _normalise(x, tuple(i for i in range(x.ndim) if i != 1), a["eps"])
    else:
        xhat = (x - rmean.reshape(cshape)) / np.sqrt(rvar.reshape(cshape) + a["eps"])
    return xhat * w.reshape(cshape) + b.reshape(cshape)
