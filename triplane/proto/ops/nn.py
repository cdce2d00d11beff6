"""Neural-network ops: activations over axes, losses, convolution, pooling, normalisation.

Conventions (torch's): images are NCHW, conv weights (O, C/groups, kH, kW); class labels
and embedding indices are integer tensors that never carry a gradient. Gradients that
have no short form in the table go through internal ops (``conv2d_grad_input``,
``max_pool2d_grad``, ...) that take the forward's attributes plus the shape to produce;
those are not differentiable again. ``layer_norm`` and ``batch_norm`` differentiate by
decomposing into table ops, so their gradients are differentiable in turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from triplane.proto import dtypes as dt
from triplane.proto.errors import AttrError, DTypeError, ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import (
    Attr,
    Cost,
    CostFn,
    GradCtx,
    OpDef,
    OpGroup,
    SplitDecl,
    broadcast_shapes,
)
from triplane.proto.ops.creation import REGION_ATTRS, check_region

if TYPE_CHECKING:
    from triplane.proto.builder import Builder, Ref

OPS = OpGroup("nn")  # registered by triplane.proto.ops.register_all

_INDEX_DTYPES = dt.INTS
_FLOAT_OR_INDEX = dt.FLOATS | dt.INTS


def _bytes(ins: Sequence[TensorType], out: TensorType) -> float:
    return float(sum(t.nbytes for t in ins) + out.nbytes)


def _cost_per_element(k: float) -> CostFn:
    def cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
        return Cost(k * max(out.size, ins[0].size), _bytes(ins, out))

    return cost


def _positive_pair(v: tuple[int, ...]) -> str | None:
    return None if len(v) == 2 and all(x >= 1 for x in v) else "must be 2 integers >= 1"


def _nonneg_pair(v: tuple[int, ...]) -> str | None:
    return None if len(v) == 2 and all(x >= 0 for x in v) else "must be 2 integers >= 0"


def _need_float(t: TensorType, what: str) -> None:
    if not t.dtype.is_float:
        raise DTypeError(f"{what} must be floating point, got {t.dtype.name} of shape {t.shape}")


def _need_index(t: TensorType, what: str) -> None:
    if not t.dtype.is_int:
        raise DTypeError(f"{what} must be integer indices, got {t.dtype.name} of shape {t.shape}")


def _axis(a: Attrs, x: TensorType) -> int:
    ax = a["axis"]
    if not -max(x.ndim, 1) <= ax < max(x.ndim, 1):
        raise AttrError(f"attribute 'axis'={ax} is out of range for a tensor of shape {x.shape}")
    return ax % max(x.ndim, 1)


# --- softmax, log_softmax ----------------------------------------------------------------


def _infer_softmax(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    _axis(a, ins[0])
    return ins[0]


def _g_softmax(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    y = n.out
    s = b.op("sum", g * y, axes=[n.attrs["axis"]], keepdims=True)
    return [y * (g - s)]


def _g_log_softmax(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    s = b.op("sum", g, axes=[n.attrs["axis"]], keepdims=True)
    return [g - b.op("exp", n.out) * s]


_AXIS = {"axis": Attr("int", -1)}
_ROWS = SplitDecl("softmax")  # along every axis but the normalised one
OPS.declare(OpDef("softmax", "nn", 1, _infer_softmax, attrs=_AXIS, dtypes=dt.FLOATS, grad=_g_softmax,
                  cost=_cost_per_element(5), split=_ROWS,
                  doc="exp(x) / sum(exp(x)) along axis (max-shifted)."))
OPS.declare(OpDef("log_softmax", "nn", 1, _infer_softmax, attrs=_AXIS, dtypes=dt.FLOATS,
                  grad=_g_log_softmax, cost=_cost_per_element(5), split=_ROWS,
                  doc="x - logsumexp(x) along axis (max-shifted)."))


# --- losses --------------------------------------------------------------------------------

_REDUCTION = Attr("str", "mean", choices=("mean", "sum", "none"))


def _smoothing(v: float) -> str | None:
    return None if 0.0 <= v < 1.0 else "must be in [0, 1)"


_CE_ATTRS = {"reduction": _REDUCTION, "ignore_index": Attr("int", None, nullable=True),
             "label_smoothing": Attr("float", 0.0, check=_smoothing)}


def _check_ce(logits: TensorType, labels: TensorType) -> None:
    _need_float(logits, "logits")
    _need_index(labels, "labels")
    if logits.ndim == 0:
        raise ShapeError("logits must have a class axis: (C,), (N, C) or (N, C, d...), got shape ()")
    want = () if logits.ndim == 1 else (logits.shape[0], *logits.shape[2:])
    if labels.shape != want:
        raise ShapeError(f"labels of shape {labels.shape} do not fit logits of shape {logits.shape} "
                         f"(expected labels of shape {want}: logits without the class axis 1)")


def _infer_ce(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    logits, labels = ins
    _check_ce(logits, labels)
    return TensorType(labels.shape if a["reduction"] == "none" else (), logits.dtype)


def _g_ce(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    logits, labels = n.inputs
    return [b.op("cross_entropy_grad", logits, labels, g, **n.attrs), None]


def _infer_ce_grad(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    logits, labels, g = ins
    _check_ce(logits, labels)
    want = labels.shape if a["reduction"] == "none" else ()
    if g.shape != want or g.dtype != logits.dtype:
        raise ShapeError(f"incoming gradient {g} does not match the loss {logits.dtype.name}{list(want)}")
    return logits


OPS.declare(OpDef(
    "cross_entropy", "nn", 2, _infer_ce, attrs=_CE_ATTRS, dtypes=_FLOAT_OR_INDEX, grad=_g_ce,
    nograd_inputs=frozenset({1}), cost=_cost_per_element(6), split=SplitDecl("cross_entropy", "add"),
    doc="Softmax cross entropy of logits (C,)/(N, C)/(N, C, d...) with integer labels "
        "(the shape of logits without axis 1). 'mean' divides by the count of labels "
        "that are not ignore_index. A label outside [0, C) fails the kernel (user error)."))
OPS.declare(OpDef("cross_entropy_grad", "nn", 3, _infer_ce_grad, attrs=_CE_ATTRS,
                  dtypes=_FLOAT_OR_INDEX, cost=_cost_per_element(6), internal=True,
                  doc="d cross_entropy / d logits, given the incoming gradient (input 2)."))


def _infer_mse(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, y = ins
    if x.dtype != y.dtype:
        raise DTypeError(f"operands have dtypes {x.dtype} and {y.dtype}; cast them to one dtype first")
    shape = broadcast_shapes(x.shape, y.shape)
    return TensorType(shape if a["reduction"] == "none" else (), x.dtype)


def _g_mse(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    d = x - y
    scale = 2.0 / max(d.type.size, 1) if n.attrs["reduction"] == "mean" else 2.0
    gd = g * (d * scale)
    return [b.unbroadcast(gd, x.shape), b.unbroadcast(-gd, y.shape)]


OPS.declare(OpDef("mse_loss", "nn", 2, _infer_mse, attrs={"reduction": _REDUCTION}, dtypes=dt.FLOATS,
                  grad=_g_mse, cost=_cost_per_element(3), split=SplitDecl("mse_loss", "add"),
                  doc="(x - y)^2 (operands broadcast), reduced by 'mean', 'sum' or 'none'."))


# --- conv2d ---------------------------------------------------------------------------------

_CONV_ATTRS = {"stride": Attr("ints", (1, 1), check=_positive_pair),
               "padding": Attr("ints", (0, 0), check=_nonneg_pair),
               "dilation": Attr("ints", (1, 1), check=_positive_pair),
               "groups": Attr("int", 1, check=lambda v: None if v >= 1 else "must be >= 1")}


def conv_out_hw(hw: Sequence[int], khw: Sequence[int], a: Attrs, what: str) -> tuple[int, int]:
    """Output height and width of a window op; ShapeError if the (dilated) window does not
    fit the padded input. ``what`` names the shapes for the message."""
    out = []
    for size, k, s, p, d in zip(hw, khw, a["stride"], a["padding"], a.get("dilation", (1, 1))):
        span = d * (k - 1) + 1
        if size + 2 * p < span:
            raise ShapeError(f"{what}: the window ({span} after dilation) is larger than the "
                             f"padded input ({size} + 2*{p})")
        out.append((size + 2 * p - span) // s + 1)
    return out[0], out[1]


def _conv_check(x: TensorType, w: TensorType, a: Attrs) -> tuple[int, int]:
    if x.dtype != w.dtype:
        raise DTypeError(f"input and weight have dtypes {x.dtype} and {w.dtype}; cast them to one dtype")
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"needs input (N, C, H, W) and weight (O, C/groups, kH, kW), "
                         f"got {x.shape} and {w.shape}")
    g = a["groups"]
    what = f"input {x.shape}, weight {w.shape}"
    if x.shape[1] % g or w.shape[0] % g:
        raise ShapeError(f"groups={g} must divide the input channels and the output channels ({what})")
    if w.shape[1] * g != x.shape[1]:
        raise ShapeError(f"weight expects {w.shape[1] * g} input channels ({w.shape[1]} per group x "
                         f"{g} groups), the input has {x.shape[1]} ({what})")
    return conv_out_hw(x.shape[2:], w.shape[2:], a, what)


def _infer_conv2d(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, w = ins
    ho, wo = _conv_check(x, w, a)
    return TensorType((x.shape[0], w.shape[0], ho, wo), x.dtype)


def _conv_flops(conv_out: TensorType, weight: tuple[int, ...]) -> float:
    # each conv output element is a dot product of C/groups*kH*kW terms; both gradient
    # ops do the same work as the forward.
    return 2.0 * conv_out.size * math.prod(weight[1:])


def _conv_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(_conv_flops(out, ins[1].shape), _bytes(ins, out))


def _conv_grad_input_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(_conv_flops(ins[0], ins[1].shape), _bytes(ins, out))


def _conv_grad_weight_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    return Cost(_conv_flops(ins[1], out.shape), _bytes(ins, out))


def _g_conv2d(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, w = n.inputs
    gx = b.op("conv2d_grad_input", g, w, input_shape=x.shape, **n.attrs)
    gw = b.op("conv2d_grad_weight", x, g, weight_shape=w.shape, **n.attrs)
    return [gx, gw]


def _infer_conv_grad_input(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    g, w = ins
    x = TensorType(tuple(a["input_shape"]), g.dtype)
    out = _infer_conv2d([x, w], a)
    if g.shape != out.shape:
        raise ShapeError(f"gradient of shape {g.shape} does not match conv2d output {out.shape}")
    return x


def _infer_conv_grad_weight(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, g = ins
    w = TensorType(tuple(a["weight_shape"]), x.dtype)
    out = _infer_conv2d([x, w], a)
    if g.shape != out.shape:
        raise ShapeError(f"gradient of shape {g.shape} does not match conv2d output {out.shape}")
    return w


OPS.declare(OpDef("conv2d", "nn", 2, _infer_conv2d, attrs=_CONV_ATTRS, dtypes=dt.FLOATS, grad=_g_conv2d,
                  cost=_conv_cost, split=SplitDecl("conv2d"),
                  doc="2-d cross-correlation, NCHW, weight (O, C/groups, kH, kW); no bias "
                      "(the SDK adds it)."))
OPS.declare(OpDef("conv2d_grad_input", "nn", 2, _infer_conv_grad_input,
                  attrs={**_CONV_ATTRS, "input_shape": Attr("shape")}, dtypes=dt.FLOATS,
                  cost=_conv_grad_input_cost, internal=True, doc="d conv2d / d input: inputs (g, weight)."))
OPS.declare(OpDef("conv2d_grad_weight", "nn", 2, _infer_conv_grad_weight,
                  attrs={**_CONV_ATTRS, "weight_shape": Attr("shape")}, dtypes=dt.FLOATS,
                  cost=_conv_grad_weight_cost, internal=True, doc="d conv2d / d weight: inputs (x, g)."))


# --- pooling ----------------------------------------------------------------------------------

_POOL_ATTRS = {"kernel": Attr("ints", check=_positive_pair),
               "stride": Attr("ints", None, nullable=True, check=_positive_pair),
               "padding": Attr("ints", (0, 0), check=_nonneg_pair)}


def pool_attrs(a: Attrs) -> Attrs:
    """The attributes with ``stride`` resolved (null means the kernel size)."""
    return a if a["stride"] is not None else a.replace(stride=a["kernel"])


def _infer_pool(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    if x.ndim != 4:
        raise ShapeError(f"needs an input (N, C, H, W), got shape {x.shape}")
    a = pool_attrs(a)
    if any(2 * p > k for p, k in zip(a["padding"], a["kernel"])):
        raise AttrError(f"padding {list(a['padding'])} must be at most half the kernel {list(a['kernel'])}")
    ho, wo = conv_out_hw(x.shape[2:], a["kernel"], a, f"input {x.shape}, kernel {list(a['kernel'])}")
    return TensorType((*x.shape[:2], ho, wo), x.dtype)


def _g_max_pool(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    return [b.op("max_pool2d_grad", n.inputs[0], g, **n.attrs)]


def _g_avg_pool(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    return [b.op("avg_pool2d_grad", g, input_shape=n.inputs[0].shape, **n.attrs)]


def _infer_max_pool_grad(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, g = ins
    out = _infer_pool([x], a)
    if g.shape != out.shape or g.dtype != x.dtype:
        raise ShapeError(f"gradient {g} does not match max_pool2d output {out}")
    return x


def _infer_avg_pool_grad(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    g = ins[0]
    x = TensorType(tuple(a["input_shape"]), g.dtype)
    out = _infer_pool([x], a)
    if g.shape != out.shape:
        raise ShapeError(f"gradient of shape {g.shape} does not match avg_pool2d output {out.shape}")
    return x


def _pool_cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    k = math.prod(a["kernel"])
    return Cost(float(k * max(out.size, ins[-1].size)), _bytes(ins, out))


OPS.declare(OpDef("max_pool2d", "nn", 1, _infer_pool, attrs=_POOL_ATTRS, dtypes=dt.FLOATS,
                  grad=_g_max_pool, cost=_pool_cost, split=SplitDecl("pool"),
                  doc="Max over kH x kW windows, NCHW; padding counts as -inf; stride null = kernel."))
OPS.declare(OpDef("avg_pool2d", "nn", 1, _infer_pool, attrs=_POOL_ATTRS, dtypes=dt.FLOATS,
                  grad=_g_avg_pool, cost=_pool_cost, split=SplitDecl("pool"),
                  doc="Mean over kH x kW windows, NCHW; padding counts as zeros in the mean "
                   "(torch's count_include_pad=True); stride null = kernel."))
OPS.declare(OpDef("max_pool2d_grad", "nn", 2, _infer_max_pool_grad, attrs=_POOL_ATTRS, dtypes=dt.FLOATS,
                  cost=_pool_cost, internal=True,
                  doc="Inputs (x, g): each window's gradient goes to its max (the first on ties)."))
OPS.declare(OpDef("avg_pool2d_grad", "nn", 1, _infer_avg_pool_grad,
                  attrs={**_POOL_ATTRS, "input_shape": Attr("shape")}, dtypes=dt.FLOATS,
                  cost=_pool_cost, internal=True, doc="Input g: spread evenly over each window."))


# --- embedding, one_hot, dropout ---------------------------------------------------------------


def _infer_embedding(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    w, idx = ins
    _need_float(w, "weight")
    _need_index(idx, "indices")
    if w.ndim != 2:
        raise ShapeError(f"weight must be (num_embeddings, dim), got shape {w.shape}")
    return TensorType((*idx.shape, w.shape[1]), w.dtype)


def _g_embedding(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    w, idx = n.inputs
    return [b.op("embedding_grad", idx, g, num_embeddings=w.shape[0]), None]


def _infer_embedding_grad(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    idx, g = ins
    _need_index(idx, "indices")
    _need_float(g, "gradient")
    if g.shape[:-1] != idx.shape or g.ndim != idx.ndim + 1:
        raise ShapeError(f"gradient of shape {g.shape} does not fit indices of shape {idx.shape}")
    return TensorType((a["num_embeddings"], g.shape[-1]), g.dtype)


OPS.declare(OpDef("embedding", "nn", 2, _infer_embedding, dtypes=_FLOAT_OR_INDEX, grad=_g_embedding,
                  nograd_inputs=frozenset({1}), cost=_cost_per_element(0), split=SplitDecl("embedding"),
                  doc="Rows of weight (V, D) picked by integer indices of any shape -> (*idx, D). "
                   "An index outside [0, V) fails the kernel (user error)."))
OPS.declare(OpDef("embedding_grad", "nn", 2, _infer_embedding_grad,
                  attrs={"num_embeddings": Attr("int", check=lambda v: None if v >= 1 else "must be >= 1")},
                  dtypes=_FLOAT_OR_INDEX, cost=_cost_per_element(1), internal=True,
                  doc="Inputs (indices, g): scatter-add of g's rows into a (V, D) zero tensor."))


def _infer_one_hot(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    _need_index(ins[0], "indices")
    return TensorType((*ins[0].shape, a["num_classes"]), dt.dtype(a["dtype"]))


OPS.declare(OpDef("one_hot", "nn", 1, _infer_one_hot, dtypes=_INDEX_DTYPES,
                  attrs={"num_classes": Attr("int", check=lambda v: None if v >= 1 else "must be >= 1"),
                      "dtype": Attr("dtype", "float32")},
               cost=_cost_per_element(1), split=SplitDecl("one_hot"),
               doc="(*idx, num_classes): 1 at each index, 0 elsewhere. An index outside "
                   "[0, num_classes) fails the kernel (user error)."))


def _dropout_p(v: float) -> str | None:
    return None if 0.0 <= v < 1.0 else "the drop probability must be in [0, 1)"


def _seed_ok(v: int) -> str | None:
    # seeds travel as JSON numbers: beyond 2**53 other SDKs would round them
    return None if 0 <= v < 1 << 53 else "must be in [0, 2**53)"


def _g_dropout(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    # The mask is a pure function of (seed, element index): recompute it rather than keep it.
    return [b.op("dropout", g, **n.attrs)]


def _infer_dropout(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    check_region(ins[0].shape, a)
    return ins[0]


OPS.declare(OpDef("dropout", "nn", 1, _infer_dropout, dtypes=dt.FLOATS, grad=_g_dropout,
                  attrs={"p": Attr("float", 0.5, check=_dropout_p), "seed": Attr("int", check=_seed_ok),
                      "training": Attr("bool", True), **REGION_ATTRS},
               cost=_cost_per_element(2), split=SplitDecl("dropout"),
               doc="In training, element i (row-major) is kept when uniform01(seed, i) >= p and "
                   "scaled by 1/(1-p); identity when training is false or p == 0. With "
                   "full_shape/start the input is that region of the full tensor and the mask "
                   "is the full mask's region."))


# --- normalisation ------------------------------------------------------------------------------


def _rstd(b: Builder, var: Ref, eps: float) -> Ref:
    """1/sqrt(var + eps) written with exp and log (var + eps > 0), so the rule uses only
    ops of the core table and stays differentiable."""
    return b.op("exp", b.op("log", var + eps) * -0.5)


def _normalise_grad(b: Builder, x: Ref, scale: Ref, g: Ref, axes: list[int], eps: float
                    ) -> tuple[Ref, Ref]:
    """dx and x-hat for y = x-hat * scale + shift with statistics over ``axes`` (biased
    variance). ``scale`` broadcasts against x."""
    count = math.prod(x.shape[i] for i in axes)
    mean = b.op("sum", x, axes=axes, keepdims=True) * (1.0 / count)
    xc = x - mean
    var = b.op("sum", xc * xc, axes=axes, keepdims=True) * (1.0 / count)
    rstd = _rstd(b, var, eps)
    xhat = xc * rstd
    gs = g * scale
    m1 = b.op("sum", gs, axes=axes, keepdims=True) * (1.0 / count)
    m2 = b.op("sum", gs * xhat, axes=axes, keepdims=True) * (1.0 / count)
    return rstd * (gs - m1 - xhat * m2), xhat


def _infer_layer_norm(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, w, bias = ins
    k = a["normalized_ndim"]
    if not 1 <= k <= x.ndim:
        raise AttrError(f"attribute 'normalized_ndim'={k} must be in [1, {x.ndim}] for input {x.shape}")
    want = x.shape[x.ndim - k:]
    if w.shape != want or bias.shape != want:
        raise ShapeError(f"weight {w.shape} and bias {bias.shape} must have the normalised shape "
                         f"{want} (the last {k} axes of input {x.shape})")
    if not x.dtype == w.dtype == bias.dtype:
        raise DTypeError(f"input, weight and bias have dtypes {x.dtype}, {w.dtype}, {bias.dtype}; "
                         "cast them to one dtype")
    return x


def _g_layer_norm(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, w, bias = n.inputs
    axes = list(range(x.ndim - n.attrs["normalized_ndim"], x.ndim))
    dx, xhat = _normalise_grad(b, x, w, g, axes, n.attrs["eps"])
    return [dx, b.unbroadcast(g * xhat, w.shape), b.unbroadcast(g, bias.shape)]


_EPS = Attr("float", 1e-5, check=lambda v: None if v > 0 else "must be > 0")
OPS.declare(OpDef("layer_norm", "nn", 3, _infer_layer_norm, dtypes=dt.FLOATS, grad=_g_layer_norm,
                  attrs={"normalized_ndim": Attr("int", 1), "eps": _EPS}, cost=_cost_per_element(8),
                  split=SplitDecl("layer_norm"),
                  doc="Inputs (x, weight, bias): normalise over the last normalized_ndim axes "
                   "(biased variance), then * weight + bias."))


def _infer_batch_norm(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x = ins[0]
    if x.ndim < 2:
        raise ShapeError(f"needs an input (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    for name, t in zip(("weight", "bias", "running_mean", "running_var"), ins[1:]):
        if t.shape != (c,):
            raise ShapeError(f"{name} has shape {t.shape}; input {x.shape} has {c} channels, so ({c},)")
        if t.dtype != x.dtype:
            raise DTypeError(f"{name} has dtype {t.dtype}, the input {x.dtype}; cast them to one dtype")
    return x


def _g_batch_norm(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, w, bias, rmean, rvar = n.inputs
    axes = [i for i in range(x.ndim) if i != 1]
    cshape = tuple(x.shape[1] if i == 1 else 1 for i in range(x.ndim))
    w_c = b.op("reshape", w, shape=cshape)
    if n.attrs["training"]:
        dx, xhat = _normalise_grad(b, x, w_c, g, axes, n.attrs["eps"])
    else:
        rstd = b.op("reshape", _rstd(b, rvar, n.attrs["eps"]), shape=cshape)
        xhat = (x - b.op("reshape", rmean, shape=cshape)) * rstd
        dx = g * (w_c * rstd)
    dw = b.op("reshape", b.unbroadcast(g * xhat, cshape), shape=w.shape)
    db = b.op("reshape", b.unbroadcast(g, cshape), shape=bias.shape)
    return [dx, dw, db, None, None]


OPS.declare(OpDef(
    "batch_norm", "nn", 5, _infer_batch_norm, dtypes=dt.FLOATS, grad=_g_batch_norm,
    attrs={"training": Attr("bool", False), "eps": _EPS}, nograd_inputs=frozenset({3, 4}),
    cost=_cost_per_element(8), split=SplitDecl("batch_norm"),
    doc="Inputs (x (N, C, ...), weight, bias, running_mean, running_var), each (C,). In "
        "training, normalise with the batch statistics over every axis but 1 (biased "
        "variance; the running inputs are ignored); else with the running ones. Updating "
        "the running statistics is the SDK's job (triplane.sdk.nn.functional.batch_norm)."))
