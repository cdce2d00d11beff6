"""ONNX losses and masks as compositions of triplane ops (``import_ops.py`` has the
conventions)."""

from __future__ import annotations

import numpy as np

from triplane.sdk import elementwise as E
from triplane.sdk import linalg as L
from triplane.sdk import reduce as R
from triplane.sdk import shape as S
from triplane.sdk.nn import functional as F
from triplane.sdk.onnx.import_ops import Node, onnx_dtype, op, value
from triplane.sdk.tensor import Tensor

__all__: list[str] = []


def _nll(n: Node, logp: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    """ONNX NegativeLogLikelihoodLoss: logp (N, C, d...), target (N, d...) -> the loss
    reduced as ``reduction`` says; ``ignore_index`` targets count nothing."""
    c = logp.shape[1]
    ignore = n.get("ignore_index")
    target = E.cast(target, "int64")
    valid = E.ne(target, ignore) if ignore is not None else None
    safe = E.where(valid, target, 0) if valid is not None else target
    hot = F.one_hot(safe, c, dtype=logp.dtype.name)           # (N, d..., C)
    perm = (0, hot.ndim - 1, *range(1, hot.ndim - 1))
    picked = R.sum(E.mul(logp, S.transpose(hot, perm)), 1)    # (N, d...)
    w = S.gather(weight, safe, 0) if weight is not None else E.add(E.mul(picked, 0), 1)
    if valid is not None:
        w = E.where(valid, w, E.mul(w, 0))
    loss = E.neg(E.mul(picked, w))
    red = n.get("reduction", "mean")
    if red == "none":
        return loss
    if red == "sum":
        return R.sum(loss)
    return E.div(R.sum(loss), R.sum(w))


@op("NegativeLogLikelihoodLoss")
def _nll_loss(n: Node, logp: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
    return _nll(n, logp, target, weight)


@op("SoftmaxCrossEntropyLoss")
def _sce(n: Node, scores: Tensor, labels: Tensor, weight: Tensor | None = None) -> list[Tensor]:
    logp = F.log_softmax(scores, 1)
    return [_nll(n, logp, labels, weight), logp]


@op("Trilu")
def _trilu(n: Node, x: Tensor, k: Tensor | None = None) -> Tensor:
    kk = 0 if k is None else int(value(k).reshape(-1)[0])
    rows, cols = x.shape[-2], x.shape[-1]
    ones = np.ones((rows, cols), bool)
    mask = np.triu(ones, kk) if n.get("upper", 1) else np.tril(ones, kk)
    zero = E.logical_and(x, False) if x.dtype.kind == "bool" else E.mul(x, 0)
    return E.where(Tensor.from_array(mask), x, zero)


# --- more elementwise functions, as compositions -----------------------------------------------


@op("Sinh", "Cosh")
def _hyperbolic(n: Node, x: Tensor) -> Tensor:
    a, b = E.exp(x), E.exp(E.neg(x))
    return E.mul(E.sub(a, b) if n.op_type == "Sinh" else E.add(a, b), 0.5)


@op("Asinh")
def _asinh(n: Node, x: Tensor) -> Tensor:
    return E.log(E.add(x, E.sqrt(E.add(E.square(x), 1))))


@op("Acosh")
def _acosh(n: Node, x: Tensor) -> Tensor:
    return E.log(E.add(x, E.sqrt(E.sub(E.square(x), 1))))


@op("Atanh")
def _atanh(n: Node, x: Tensor) -> Tensor:
    return E.mul(E.log(E.div(E.add(x, 1), E.sub(1, x))), 0.5)


@op("Round")
def _round(n: Node, x: Tensor) -> Tensor:
    """Half to even, as ONNX (and numpy) round."""
    f = E.floor(x)
    d = E.sub(x, f)
    half = E.add(f, E.remainder(f, 2))  # a tie goes to the even neighbour
    return E.where(E.gt(d, 0.5), E.add(f, 1), E.where(E.lt(d, 0.5), f, half))


@op("Swish")
def _swish(n: Node, x: Tensor) -> Tensor:
    return E.mul(x, E.sigmoid(E.mul(x, n.get("alpha", 1.0))))


@op("InstanceNormalization")
def _instance_norm(n: Node, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    axes = tuple(range(2, x.ndim))
    mean = R.mean(x, axes, True)
    centred = E.sub(x, mean)
    y = E.mul(centred, E.rsqrt(E.add(R.mean(E.square(centred), axes, True), float(n.get("epsilon", 1e-5)))))
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    return E.add(E.mul(y, S.reshape(scale, per_channel)), S.reshape(bias, per_channel))


@op("LpNormalization")
def _lp_norm(n: Node, x: Tensor) -> Tensor:
    axis, p = n.get("axis", -1) % x.ndim, n.get("p", 2)
    if p not in (1, 2):
        raise n.refuse(f"p={p}")
    norm = R.sum(E.abs(x), axis, True) if p == 1 else E.sqrt(R.sum(E.square(x), axis, True))
    zero = E.eq(norm, 0)
    return E.where(zero, E.mul(x, 0), E.div(x, E.where(zero, E.add(norm, 1), norm)))


@op("CumSum")
def _cumsum(n: Node, x: Tensor, axis: Tensor) -> Tensor:
    """A product with a triangle of ones along the axis (moved last and back)."""
    ax = int(value(axis).reshape(-1)[0]) % x.ndim
    k = x.shape[ax]
    i, j = np.indices((k, k))
    keep = {(0, 0): i <= j, (1, 0): i < j, (0, 1): i >= j, (1, 1): i > j}[
        (int(n.get("exclusive", 0)), int(n.get("reverse", 0)))]
    tri = Tensor.from_array(keep.astype(x.dtype.np))
    last = S.transpose(x, (*[d for d in range(x.ndim) if d != ax], ax))
    y = L.matmul(last, tri)
    back = list(range(x.ndim - 1))
    back.insert(ax, x.ndim - 1)
    return S.transpose(y, tuple(back))


# --- attention ---------------------------------------------------------------------------------


def _neg_inf(like: Tensor, shape: tuple[int, ...]) -> Tensor:
    return Tensor.from_array(np.full(shape, -np.inf, like.dtype.np))


@op("Attention")
def _attention(n: Node, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               past_k: Tensor | None = None, past_v: Tensor | None = None,
               nonpad: Tensor | None = None) -> list[Tensor]:
    """ONNX Attention (opset 23): softmax(Q K^T * scale + bias) V over heads, with the
    grouped-query repeat of K and V, causal and window masks, softcap and a past cache."""
    if nonpad is not None:
        raise n.refuse("nonpad_kv_seqlen (an external cache)")
    three_d = q.ndim == 3
    if three_d:
        qh, kvh = n.get("q_num_heads"), n.get("kv_num_heads")

        def heads(t: Tensor, h: int) -> Tensor:
            b, seq, hidden = t.shape
            return S.transpose(S.reshape(t, (b, seq, h, hidden // h)), (0, 2, 1, 3))
        q, k, v = heads(q, qh), heads(k, kvh), heads(v, kvh)
    scale = n.get("scale")
    root = float(np.sqrt(1 / np.sqrt(q.shape[3]) if scale is None else scale))
    offset = 0 if past_k is None else past_k.shape[2]
    if past_k is not None:
        k, v = S.concat([past_k, k], 2), S.concat([past_v, v], 2)
    present_k, present_v = k, v
    lq, lk = q.shape[2], k.shape[2]
    bias = None
    if mask is not None:
        if mask.shape[-1] < lk:  # padded to the keys' length: masked out
            rest = (*mask.shape[:-1], lk - mask.shape[-1])
            fill = (Tensor.from_array(np.zeros(rest, bool)) if mask.dtype.kind == "bool"
                    else _neg_inf(mask, rest))
            mask = S.concat([mask, fill], -1)
        bias = E.where(mask, E.cast(0, q.dtype), _neg_inf(q, ())) if mask.dtype.kind == "bool" else mask
    i, j = np.arange(lq)[:, None] + offset, np.arange(lk)[None, :]
    allowed = np.ones((lq, lk), bool)
    if n.get("is_causal", 0):
        allowed &= j <= i
    left, right = n.get("left_window_size", -1), n.get("right_window_size", -1)
    if left >= 0:
        allowed &= i - j <= left
    if right >= 0:
        allowed &= j - i <= right
    if not allowed.all():
        static = Tensor.from_array(np.where(allowed, 0, -np.inf).astype(q.dtype.np))
        bias = static if bias is None else E.add(bias, static)
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # each K/V head serves `groups` query heads in turn (numpy.repeat on axis 1)
        def rep(t: Tensor) -> Tensor:
            b, h, seq, d = t.shape
            wide = S.broadcast_to(S.unsqueeze(t, 2), (b, h, groups, seq, d))
            return S.reshape(wide, (b, h * groups, seq, d))
        k, v = rep(k), rep(v)
    qk = L.matmul(E.mul(q, root), S.transpose(E.mul(k, root), (0, 1, 3, 2)))
    cap = n.get("softcap", 0.0)
    if cap and cap > 0:
        qk = E.mul(E.tanh(E.div(qk, cap)), cap)
    scores = qk if bias is None else E.add(qk, bias)
    mode = n.get("qk_matmul_output_mode", 0)
    precision = n.get("softmax_precision")
    probs = F.softmax(E.cast(scores, onnx_dtype(precision, n)) if precision else scores, -1)
    if bias is not None:  # a row with every key masked attends to nothing
        masked = E.eq(R.max(E.add(E.mul(qk, 0), bias), -1, True), -np.inf)
        probs = E.where(masked, Tensor.from_array(np.zeros((), probs.dtype.np)), probs)
    probs = E.cast(probs, q.dtype)
    y = L.matmul(probs, v)
    if three_d:
        b, h, seq, d = y.shape
        y = S.reshape(S.transpose(y, (0, 2, 1, 3)), (b, seq, h * d))
    qk_out = {2: scores, 3: probs}.get(mode, qk)
    return [y, present_k, present_v, E.cast(qk_out, q.dtype)]
