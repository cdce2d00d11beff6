"""ONNX losses and masks as compositions of triplane ops (``import_ops.py`` has the
conventions)."""

from __future__ import annotations

import numpy as np

from triplane.sdk import elementwise as E
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
