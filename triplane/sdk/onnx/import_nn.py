"""ONNX losses and masks as compositions of triplane ops (``import_ops.py`` has the
conventions)."""

from __future__ import annotations

import numpy as np

from triplane.sdk import elementwise as E
from triplane.sdk import linalg as L
from triplane.sdk import reduce as R
from triplane.sdk import shape as S
from triplane.sdk.nn import functional as F
from triplane.sdk.onnx.import_ops import Node, op, value
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
