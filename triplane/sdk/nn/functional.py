"""Neural-network functions with torch's names and signatures: ``F.conv2d``, ``F.cross_entropy``...

Everything is lazy like the rest of the SDK: each call records ops (shapes checked at
the line that calls it) and nothing runs until a value is read. Images are NCHW. Where a
torch argument takes an int or a pair (``stride``, ``padding``...), so does this one.

Functional state: ``batch_norm`` does not update running statistics in place (a lazy
graph has no in-place writes); in training it returns the new statistics for the caller
(``nn.BatchNorm2d``) to assign.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import GraphError, ShapeError
from triplane.sdk import creation as _creation
from triplane.sdk.elementwise import (  # re-exported (torch's F.relu)
    as_float,
    gelu,
    operands,
    relu,
    sigmoid,
    silu,
    tanh,
)
from triplane.sdk.tensor import UNSET, Tensor, apply, as_tensor, spelling

__all__ = [
    "avg_pool2d", "batch_norm", "conv2d", "cross_entropy", "dropout", "embedding", "gelu",
    "layer_norm", "log_softmax", "max_pool2d", "mse_loss", "one_hot", "relu", "sigmoid",
    "silu", "softmax", "tanh",
]

IntOrPair = int | Sequence[int]


def _pair(v: IntOrPair, what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    t = tuple(v)
    if len(t) != 2:
        raise ValueError(f"{what} must be an int or a pair of ints, got {v!r}")
    return (int(t[0]), int(t[1]))


def _reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    return x if tuple(x.shape) == tuple(shape) else apply("reshape", [x], shape=tuple(shape))


def _full(value: float, shape: Sequence[int], dtype: dt.DType) -> Tensor:
    return apply("full", [], value=value, shape=tuple(shape), dtype=dtype.name)


# --- activations over an axis, losses ----------------------------------------------------------


def softmax(x: Any, axis: int = UNSET, *, dim: int = UNSET) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (or torch's ``dim``; default -1), computed
    stably; integers are computed in the float ``tp.exp`` would give them."""
    return apply("softmax", [as_float(x)], axis=spelling("softmax", "axis", axis, "dim", dim, -1))


def log_softmax(x: Any, axis: int = UNSET, *, dim: int = UNSET) -> Tensor:
    """x - logsumexp(x) along ``axis`` (or torch's ``dim``; default -1), computed stably."""
    return apply("log_softmax", [as_float(x)],
                 axis=spelling("log_softmax", "axis", axis, "dim", dim, -1))


def cross_entropy(logits: Any, labels: Any, reduction: str = "mean", ignore_index: int | None = None,
                  label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross entropy of ``logits`` (C,), (N, C) or (N, C, d...) with integer class
    ``labels`` (the shape of logits without axis 1). ``reduction`` is "mean" (over the
    labels that are not ``ignore_index``), "sum" or "none". Probability targets are not
    supported (float labels raise DTypeError). Labels outside [0, C) raise KernelError
    when the graph runs."""
    return apply("cross_entropy", [as_tensor(logits), as_tensor(labels)], reduction=reduction,
                 ignore_index=ignore_index, label_smoothing=label_smoothing)


def mse_loss(x: Any, y: Any, reduction: str = "mean") -> Tensor:
    """Mean (or "sum", or "none": elementwise) of (x - y)^2; operands broadcast and promote."""
    return apply("mse_loss", operands(x, y), reduction=reduction)


# --- convolution and pooling ------------------------------------------------------------------


def conv2d(x: Any, weight: Any, bias: Any = None, stride: IntOrPair = 1, padding: IntOrPair = 0,
           dilation: IntOrPair = 1, groups: int = 1) -> Tensor:
    """2-d cross-correlation of ``x`` (N, C, H, W) with ``weight`` (O, C/groups, kH, kW),
    plus ``bias`` (O,) if given -> (N, O, Ho, Wo)."""
    xt, wt = operands(x, weight)
    y = apply("conv2d", [xt, wt], stride=_pair(stride, "stride"), padding=_pair(padding, "padding"),
              dilation=_pair(dilation, "dilation"), groups=groups)
    if bias is None:
        return y
    bt = as_tensor(bias, like=y)
    if bt.shape != (wt.shape[0],):
        raise ShapeError(f"conv2d: bias has shape {bt.shape}; weight {wt.shape} needs ({wt.shape[0]},)")
    return y + _reshape(bt, (1, wt.shape[0], 1, 1))


def _pool(op: str, x: Any, kernel_size: IntOrPair, stride: IntOrPair | None, padding: IntOrPair) -> Tensor:
    k = _pair(kernel_size, "kernel_size")
    s = k if stride is None else _pair(stride, "stride")
    return apply(op, [as_tensor(x)], kernel=k, stride=s, padding=_pair(padding, "padding"))


def max_pool2d(x: Any, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0) -> Tensor:
    """Max over windows of (N, C, H, W); ``stride`` defaults to ``kernel_size``; padding
    (at most half the kernel) never wins the max."""
    return _pool("max_pool2d", x, kernel_size, stride, padding)


def avg_pool2d(x: Any, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0) -> Tensor:
    """Mean over windows of (N, C, H, W); padded zeros count in the mean (torch's default
    count_include_pad=True)."""
    return _pool("avg_pool2d", x, kernel_size, stride, padding)


# --- lookups, dropout -----------------------------------------------------------------------


def embedding(indices: Any, weight: Any) -> Tensor:
    """Rows of ``weight`` (V, D) at integer ``indices`` of any shape -> (*indices.shape, D).
    Indices outside [0, V) raise KernelError when the graph runs."""
    return apply("embedding", [as_tensor(weight), as_tensor(indices)])


def one_hot(indices: Any, num_classes: int, dtype: Any = "float32") -> Tensor:
    """(*indices.shape, num_classes) of ``dtype``: 1 where the class is the index, else 0."""
    return apply("one_hot", [as_tensor(indices)], num_classes=num_classes, dtype=dt.dtype(dtype).name)


def dropout(x: Any, p: float = 0.5, training: bool = True, seed: int | None = None) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p), in training;
    ``x`` itself otherwise (or when p == 0). ``p`` must be in [0, 1). The mask is a pure
    function of ``seed`` and the element's index, so the same seed gives the same mask;
    ``seed=None`` takes the next seed of the SDK's stream (see ``tp.manual_seed``)."""
    xt = as_tensor(x)
    attrs = {"p": p, "seed": 0 if seed is None else seed, "training": training}
    try:  # reject a bad p even when dropout is a no-op
        a = optable.get("dropout").normalise_attrs(attrs)
    except GraphError as e:
        raise e.at(op="dropout").with_traceback(None) from None
    if not training or a["p"] == 0.0:
        return xt
    return apply("dropout", [xt], **{**attrs, "seed": _creation.next_seed() if seed is None else seed})


# --- normalisation ------------------------------------------------------------------------------


def layer_norm(x: Any, normalized_shape: int | Sequence[int], weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` axes (biased variance), then
    * weight + bias (both of ``normalized_shape``; default ones and zeros)."""
    xt = as_tensor(x)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or k > xt.ndim or tuple(xt.shape[xt.ndim - k:]) != shape:
        raise ShapeError(f"layer_norm: normalized_shape {list(shape)} is not the trailing shape of "
                         f"input {xt.shape}")
    w = _full(1.0, shape, xt.dtype) if weight is None else as_tensor(weight, like=xt)
    b = _full(0.0, shape, xt.dtype) if bias is None else as_tensor(bias, like=xt)
    return apply("layer_norm", [xt, w, b], normalized_ndim=k, eps=eps)


def batch_norm(x: Any, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5
               ) -> Tensor | tuple[Tensor, Tensor | None, Tensor | None]:
    """Batch normalisation of ``x`` (N, C, ...) per channel; ``weight``/``bias`` (C,)
    default to ones/zeros.

    ``training=False``: normalise with ``running_mean``/``running_var`` and return the
    output Tensor.

    ``training=True``: normalise with the batch's statistics (biased variance) and return
    ``(y, new_running_mean, new_running_var)`` where
    ``new = (1 - momentum) * running + momentum * batch_statistic`` and the batch variance
    there is the unbiased one (torch's rule). Running statistics may be None in training;
    their new value is then None too. The new statistics are lazy tensors: assign them
    (``running_mean.assign(new_mean)``) to keep them.
    """
    xt = as_tensor(x)
    if xt.ndim < 2:
        raise ShapeError(f"batch_norm: needs an input (N, C, ...), got shape {xt.shape}")
    c = xt.shape[1]
    if not training and (running_mean is None or running_var is None):
        raise ValueError("batch_norm: running_mean and running_var are required when training=False")
    w = _full(1.0, (c,), xt.dtype) if weight is None else as_tensor(weight, like=xt)
    b = _full(0.0, (c,), xt.dtype) if bias is None else as_tensor(bias, like=xt)
    rm = _full(0.0, (c,), xt.dtype) if running_mean is None else as_tensor(running_mean, like=xt)
    rv = _full(1.0, (c,), xt.dtype) if running_var is None else as_tensor(running_var, like=xt)
    y = apply("batch_norm", [xt, w, b, rm, rv], training=training, eps=eps)
    if not training:
        return y
    axes = [i for i in range(xt.ndim) if i != 1]
    count = math.prod(xt.shape[i] for i in axes)
    mean = apply("sum", [xt], axes=axes, keepdims=False) * (1.0 / count)
    xc = xt - _reshape(mean, [c if i == 1 else 1 for i in range(xt.ndim)])
    var = apply("sum", [xc * xc], axes=axes, keepdims=False) * (1.0 / max(count - 1, 1))
    new_mean = None if running_mean is None else rm * (1.0 - momentum) + mean * momentum
    new_var = None if running_var is None else rv * (1.0 - momentum) + var * momentum
    return y, new_mean, new_var
