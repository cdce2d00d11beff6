"""ONNX operators as functions of triplane Tensors: the import side of the op map.

Each entry of :data:`OPS` takes a :class:`Node` (the ONNX node's attributes, decoded, and
its opset) and the node's inputs (``None`` for an omitted optional input) and returns the
outputs. An operator is here when triplane's op table computes it exactly, alone or as a
short composition of its ops; everything else is absent, and importing it names it
(``importer.py``). Inputs that ONNX passes as tensors but triplane needs as attributes
(a Reshape's shape, a Slice's starts, a ReduceSum's axes) are read as values: they must be
computable when the graph is recorded (constants, initializers, or shapes of inputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import GraphError
from triplane.sdk import elementwise as E
from triplane.sdk import linalg as L
from triplane.sdk import reduce as R
from triplane.sdk import shape as S
from triplane.sdk.nn import functional as F
from triplane.sdk.tensor import Tensor, apply

__all__ = ["OPS", "Node", "Unsupported"]


class Unsupported(GraphError):
    """An ONNX operator (or a form of one: an attribute value, a dtype) triplane does not
    compute; the message names the operator and what is not supported."""

    kind = "unsupported_op"


@dataclass
class Node:
    op_type: str
    attrs: dict[str, Any]
    opset: int
    name: str = ""
    outputs: int = 1

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def refuse(self, what: str) -> Unsupported:
        return Unsupported(f"ONNX {self.op_type}: {what} is not supported")


Fn = Callable[..., Any]
OPS: dict[str, Fn] = {}


def op(*names: str) -> Callable[[Fn], Fn]:
    def deco(fn: Fn) -> Fn:
        for n in names:
            OPS[n] = fn
        return fn
    return deco


def value(t: Tensor | None) -> np.ndarray | None:
    """The value of a tensor ONNX passes where triplane needs a constant."""
    return None if t is None else np.asarray(t.numpy())


def ints(t: Tensor | None) -> list[int] | None:
    v = value(t)
    return None if v is None else [int(i) for i in v.reshape(-1)]


# --- elementwise -------------------------------------------------------------------------

_UNARY = {"Abs": E.abs, "Ceil": E.ceil, "Cos": E.cos, "Erf": E.erf, "Exp": E.exp, "Floor": E.floor,
          "Log": E.log, "Neg": E.neg, "Reciprocal": E.reciprocal, "Relu": E.relu, "Sigmoid": E.sigmoid,
          "Sign": E.sign, "Sin": E.sin, "Sqrt": E.sqrt, "Tan": E.tan, "Tanh": E.tanh, "Not": E.logical_not}
for _name, _fn in _UNARY.items():
    OPS[_name] = (lambda f: lambda n, x: f(x))(_fn)

_BINARY = {"Add": E.add, "Sub": E.sub, "Mul": E.mul, "Equal": E.eq, "Greater": E.gt,
           "GreaterOrEqual": E.ge, "Less": E.lt, "LessOrEqual": E.le, "And": E.logical_and,
           "Or": E.logical_or, "Xor": E.ne}
for _name, _fn in _BINARY.items():
    OPS[_name] = (lambda f: lambda n, a, b: f(a, b))(_fn)


@op("Identity")
def _identity(n: Node, x: Tensor) -> Tensor:
    return x


@op("Div")
def _div(n: Node, a: Tensor, b: Tensor) -> Tensor:
    if a.dtype.is_float:
        return E.div(a, b)
    # integer division truncates toward zero in ONNX (C), floors in triplane (numpy)
    q = E.floor_divide(E.abs(a), E.abs(b))
    neg = E.ne(E.lt(a, 0), E.lt(b, 0))
    return E.where(neg, E.neg(q), q)


@op("Mod")
def _mod(n: Node, a: Tensor, b: Tensor) -> Tensor:
    if n.get("fmod", 0):
        if a.dtype.is_float:
            return E.sub(a, E.mul(b, _trunc(E.div(a, b))))
        return E.sub(a, E.mul(b, _div(n, a, b)))
    return E.remainder(a, b)


def _trunc(x: Tensor) -> Tensor:
    return E.where(E.lt(x, 0), E.ceil(x), E.floor(x))


@op("Pow")
def _pow(n: Node, a: Tensor, b: Tensor) -> Tensor:
    return E.cast(E.pow(a, E.cast(b, a.dtype)), a.dtype)


def _variadic(f: Fn) -> Fn:
    def run(n: Node, *xs: Tensor) -> Tensor:
        out = xs[0]
        for x in xs[1:]:
            out = f(out, x)
        return out
    return run


OPS["Max"] = _variadic(E.maximum)
OPS["Min"] = _variadic(E.minimum)
OPS["Sum"] = _variadic(E.add)


@op("Mean")
def _mean(n: Node, *xs: Tensor) -> Tensor:
    return E.div(_variadic(E.add)(n, *xs), float(len(xs)))


@op("Where")
def _where(n: Node, c: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return E.where(c, a, b)


@op("Cast")
def _cast(n: Node, x: Tensor) -> Tensor:
    return E.cast(x, onnx_dtype(n.get("to"), n))


@op("CastLike")
def _cast_like(n: Node, x: Tensor, like: Tensor) -> Tensor:
    return E.cast(x, like.dtype)


def onnx_dtype(elem: int, n: Node | None = None) -> dt.DType:
    from onnx import helper

    try:
        return dt.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except Exception:
        from onnx import TensorProto

        name = TensorProto.DataType.Name(elem) if elem in TensorProto.DataType.values() else str(elem)
        raise Unsupported(f"{'ONNX ' + n.op_type + ': ' if n else ''}element type {name} is not one of "
                          f"triplane's dtypes ({sorted(dt.BY_NAME)})") from None


@op("IsNaN")
def _isnan(n: Node, x: Tensor) -> Tensor:
    return E.ne(x, x)


@op("IsInf")
def _isinf(n: Node, x: Tensor) -> Tensor:
    pos = E.eq(x, math.inf) if n.get("detect_positive", 1) else E.ne(x, x)
    neg = E.eq(x, -math.inf) if n.get("detect_negative", 1) else E.ne(x, x)
    return E.logical_or(E.logical_and(pos, E.eq(x, x)), E.logical_and(neg, E.eq(x, x)))


# --- activations (compositions) ----------------------------------------------------------------


@op("LeakyRelu")
def _leaky(n: Node, x: Tensor) -> Tensor:
    return E.where(E.ge(x, 0), x, E.mul(x, n.get("alpha", 0.01)))


@op("PRelu")
def _prelu(n: Node, x: Tensor, slope: Tensor) -> Tensor:
    return E.where(E.ge(x, 0), x, E.mul(x, slope))


@op("Elu")
def _elu(n: Node, x: Tensor) -> Tensor:
    a = n.get("alpha", 1.0)
    return E.where(E.gt(x, 0), x, E.mul(E.sub(E.exp(x), 1), a))


@op("Celu")
def _celu(n: Node, x: Tensor) -> Tensor:
    a = n.get("alpha", 1.0)
    return E.add(E.maximum(x, 0), E.minimum(E.mul(E.sub(E.exp(E.div(x, a)), 1), a), 0))


@op("Selu")
def _selu(n: Node, x: Tensor) -> Tensor:
    a, g = n.get("alpha", 1.67326319217681884765625), n.get("gamma", 1.05070102214813232421875)
    return E.mul(E.where(E.gt(x, 0), x, E.mul(E.sub(E.exp(x), 1), a)), g)


@op("ThresholdedRelu")
def _trelu(n: Node, x: Tensor) -> Tensor:
    return E.where(E.gt(x, n.get("alpha", 1.0)), x, E.mul(x, 0))


@op("HardSigmoid")
def _hsig(n: Node, x: Tensor) -> Tensor:
    y = E.add(E.mul(x, n.get("alpha", 0.2)), n.get("beta", 0.5))
    return E.minimum(E.maximum(y, 0), 1)


@op("HardSwish")
def _hswish(n: Node, x: Tensor) -> Tensor:
    return E.mul(x, E.minimum(E.maximum(E.add(E.mul(x, 1 / 6), 0.5), 0), 1))


@op("Softplus")
def _softplus(n: Node, x: Tensor) -> Tensor:
    return E.log(E.add(E.exp(x), 1))


@op("Softsign")
def _softsign(n: Node, x: Tensor) -> Tensor:
    return E.div(x, E.add(E.abs(x), 1))


@op("Mish")
def _mish(n: Node, x: Tensor) -> Tensor:
    return E.mul(x, E.tanh(_softplus(n, x)))


@op("Gelu")
def _gelu(n: Node, x: Tensor) -> Tensor:
    if n.get("approximate", "none") != "none":
        raise n.refuse(f"approximate={n.get('approximate')!r} (triplane's gelu is the exact one)")
    return E.gelu(x)


@op("Shrink")
def _shrink(n: Node, x: Tensor) -> Tensor:
    lam, bias = n.get("lambd", 0.5), n.get("bias", 0.0)
    zero = E.mul(x, 0)
    return E.where(E.lt(x, -lam), E.add(x, bias), E.where(E.gt(x, lam), E.sub(x, bias), zero))


@op("Clip")
def _clip(n: Node, x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None) -> Tensor:
    if n.opset < 11:
        lo_v, hi_v = n.get("min"), n.get("max")
        lo = None if lo_v is None else Tensor.from_array(np.array(lo_v, x.dtype.np))
        hi = None if hi_v is None else Tensor.from_array(np.array(hi_v, x.dtype.np))
    if lo is not None:
        x = E.maximum(x, lo)
    if hi is not None:
        x = E.minimum(x, hi)
    return x


@op("Softmax", "LogSoftmax")
def _softmax(n: Node, x: Tensor) -> Tensor:
    f = F.softmax if n.op_type == "Softmax" else F.log_softmax
    axis = n.get("axis", -1 if n.opset >= 13 else 1)
    if n.opset >= 13:
        return f(x, axis)
    # before opset 13 the input is flattened to 2-d at axis
    ax = axis % max(x.ndim, 1)
    flat = S.reshape(x, (math.prod(x.shape[:ax]), math.prod(x.shape[ax:])))
    return S.reshape(f(flat, 1), x.shape)


# --- linear algebra and nn --------------------------------------------------------------------


@op("MatMul")
def _matmul(n: Node, a: Tensor, b: Tensor) -> Tensor:
    return L.matmul(a, b)


@op("Gemm")
def _gemm(n: Node, a: Tensor, b: Tensor, c: Tensor | None = None) -> Tensor:
    if n.get("transA", 0):
        a = S.transpose(a)
    if n.get("transB", 0):
        b = S.transpose(b)
    y = L.matmul(a, b)
    alpha, beta = n.get("alpha", 1.0), n.get("beta", 1.0)
    if alpha != 1.0:
        y = E.mul(y, alpha)
    if c is not None:
        y = E.add(y, c if beta == 1.0 else E.mul(c, beta))
    return y


def _pads2d(n: Node, x: Tensor, kernel: Sequence[int], strides: Sequence[int],
            dilations: Sequence[int] = (1, 1)) -> tuple[int, int]:
    auto = n.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(2):
            size = x.shape[2 + i]
            out = -(-size // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size, 0)
            if total % 2:
                raise n.refuse(f"auto_pad={auto} with uneven padding ({total} on axis {2 + i})")
            pads.append(total // 2)
        return pads[0], pads[1]
    p = list(n.get("pads", [0, 0, 0, 0])) if auto != "VALID" else [0, 0, 0, 0]
    if len(p) != 4 or p[0] != p[2] or p[1] != p[3]:
        raise n.refuse(f"pads {p} (triplane pads both sides of an axis alike)")
    return p[0], p[1]


def _check2d(n: Node, x: Tensor) -> None:
    if x.ndim != 4:
        raise n.refuse(f"a {x.ndim - 2}-d input (triplane's convolutions and pools are 2-d)")


def _lift1d(n: Node) -> Node:
    """A 1-d convolution or pool's node as the 2-d one over (N, C, 1, L)."""
    a = dict(n.attrs)
    for key, one in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("output_padding", 0)):
        if key in a:
            a[key] = [one, *a[key]]
    if "pads" in a:
        a["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
    return Node(n.op_type, a, n.opset, n.name, n.outputs)


def _one_d(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def run(n: Node, x: Tensor, *rest: Tensor | None) -> Tensor:
        if x.ndim != 3:
            return fn(n, x, *rest)
        lifted = [S.unsqueeze(t, 2) if t is not None and t.ndim == 3 else t for t in rest]
        return S.squeeze(fn(_lift1d(n), S.unsqueeze(x, 2), *lifted), 2)
    return run


@op("Conv")
@_one_d
def _conv(n: Node, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    _check2d(n, x)
    k = list(n.get("kernel_shape", w.shape[2:]))
    strides, dil = list(n.get("strides", [1, 1])), list(n.get("dilations", [1, 1]))
    pads = _pads2d(n, x, k, strides, dil)
    return F.conv2d(x, w, b, stride=tuple(strides), padding=pads, dilation=tuple(dil),
                    groups=n.get("group", 1))


@op("ConvTranspose")
@_one_d
def _conv_transpose(n: Node, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """The input-gradient of the convolution it transposes (``conv2d_grad_input``)."""
    _check2d(n, x)
    if n.get("output_shape") is not None or n.get("auto_pad", "NOTSET") != "NOTSET":
        raise n.refuse("output_shape or auto_pad (give pads and output_padding)")
    strides, dil = list(n.get("strides", [1, 1])), list(n.get("dilations", [1, 1]))
    k = list(n.get("kernel_shape", w.shape[2:]))
    p = list(n.get("pads", [0, 0, 0, 0]))
    if p[0] != p[2] or p[1] != p[3]:
        raise n.refuse(f"pads {p} (triplane pads both sides of an axis alike)")
    extra = list(n.get("output_padding", [0, 0]))
    group = n.get("group", 1)
    hw = [strides[i] * (x.shape[2 + i] - 1) + extra[i] + (k[i] - 1) * dil[i] + 1 - 2 * p[i] for i in range(2)]
    y = apply("conv2d_grad_input", [x, w], stride=tuple(strides), padding=(p[0], p[1]), dilation=tuple(dil),
              groups=group, input_shape=(x.shape[0], w.shape[1] * group, *hw))
    return y if b is None else E.add(y, S.reshape(b, (1, b.shape[0], 1, 1)))


@op("MaxPool", "AveragePool")
@_one_d
def _pool(n: Node, x: Tensor) -> Tensor:
    _check2d(n, x)
    if n.get("ceil_mode", 0):
        raise n.refuse("ceil_mode=1")
    if any(d != 1 for d in n.get("dilations", [1, 1])):
        raise n.refuse("dilations other than 1")
    if n.get("storage_order", 0):
        raise n.refuse("storage_order=1")
    k = list(n.get("kernel_shape"))
    strides = list(n.get("strides", [1, 1]))
    pads = _pads2d(n, x, k, strides)
    if n.op_type == "MaxPool":
        return F.max_pool2d(x, tuple(k), tuple(strides), pads)
    y = F.avg_pool2d(x, tuple(k), tuple(strides), pads)
    if any(pads) and not n.get("count_include_pad", 0):
        # triplane's average counts the padding: divide by the share of each window inside
        inside = F.avg_pool2d(E.add(E.mul(x, 0), 1), tuple(k), tuple(strides), pads)
        y = E.div(y, inside)
    return y


@op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(n: Node, x: Tensor) -> Tensor:
    f = R.mean if n.op_type == "GlobalAveragePool" else R.max
    return f(x, tuple(range(2, x.ndim)), True)


@op("BatchNormalization")
def _batch_norm(n: Node, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    if n.get("training_mode", 0):
        raise n.refuse("training_mode=1")
    return apply("batch_norm", [x, scale, bias, mean, var], training=False, eps=n.get("epsilon", 1e-5))


@op("LayerNormalization")
def _layer_norm(n: Node, x: Tensor, scale: Tensor, bias: Tensor | None = None) -> list[Tensor]:
    axis = n.get("axis", -1) % x.ndim
    if n.get("stash_type", 1) != 1:
        raise n.refuse("stash_type other than float32")
    axes = tuple(range(axis, x.ndim))
    xf = E.cast(x, "float32")
    mean = R.mean(xf, axes, True)
    centred = E.sub(xf, mean)
    inv = E.rsqrt(E.add(R.mean(E.square(centred), axes, True), float(n.get("epsilon", 1e-5))))
    y = E.cast(E.mul(centred, inv), x.dtype)
    y = E.mul(y, scale)
    if bias is not None:
        y = E.add(y, bias)
    return [y, mean, inv]


@op("RMSNormalization")
def _rms_norm(n: Node, x: Tensor, scale: Tensor) -> Tensor:
    axis = n.get("axis", -1) % x.ndim
    xf = E.cast(x, "float32")
    ms = R.mean(E.square(xf), tuple(range(axis, x.ndim)), True)
    y = E.cast(E.mul(xf, E.rsqrt(E.add(ms, float(n.get("epsilon", 1e-5))))), x.dtype)
    return E.mul(y, scale)


@op("Dropout")
def _dropout(n: Node, x: Tensor, ratio: Tensor | None = None, training: Tensor | None = None) -> Any:
    if training is not None and bool(value(training)):
        raise n.refuse("training_mode=true (a random mask)")
    return [x, S.broadcast_to(Tensor.from_array(np.array(True)), x.shape)]
