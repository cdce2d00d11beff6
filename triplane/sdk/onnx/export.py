"""Exporting a triplane model to ONNX: the export side of the op map.

:func:`to_onnx` writes the graph of a ``tp.Model`` (or of a function or module, traced on
example inputs as ``tp.save_model`` traces it) as an ONNX ``ModelProto`` of opset
:data:`OPSET`: its parameters become initializers, its inputs and outputs keep their
names, and every node becomes the ONNX nodes :data:`EXPORTS` gives for its op. A node
without inputs (``constant``, ``full``, ``arange``...) is computed and stored as an
initializer. An op without an entry raises :class:`Unsupported` naming it and the node.

The batch stays dynamic in ONNX (a ``batch`` dimension) when the model's batch rules
(``model_trace.py``) touch only attributes that are input tensors in ONNX
(:data:`DYNAMIC_ATTRS`: the shapes of ``reshape``, ``broadcast_to`` and ``full``, the
bounds of ``slice``): those are computed from ``Shape`` of a batched input at run time.
Otherwise the export is for the example's batch size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.ir import Node
from triplane.sdk.model import Model, trace_model
from triplane.sdk.onnx.import_ops import Unsupported
from triplane.sdk.tensor import apply

__all__ = ["EXPORTS", "OPSET", "to_onnx"]

OPSET = 18
END = 2**62  # a Slice end past any dimension: "to the end"


class Emitter:
    """What an export rule writes with: ``node(op, inputs, **attrs)`` appends an ONNX node
    and returns its output's name; ``const(array)`` adds an initializer."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.shapes: dict[str, tuple[int, ...]] = {}  # a triplane node's ONNX name -> its shape
        self._n = 0
        # the batch rules of the node being written: attr -> [(index, scale, offset)], and the
        # input whose dimension 0 is the batch (read with Shape when a rule needs it)
        self.rules: dict[str, list[tuple[int, int, int]]] = {}
        self.batch_input: str | None = None
        self._batch: str | None = None

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}__{self._n}"

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        out = out or self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def ints(self, n: Node, attr: str) -> str:
        """The integer list attribute ``attr`` of ``n`` as an int64 tensor: a constant, or,
        where batch rules touch it, computed from the batch at run time."""
        values = list(n.attrs[attr])
        rules = self.rules.get(attr)
        if not rules:
            return self.const(values)
        if self._batch is None:
            assert self.batch_input is not None
            self._batch = self.node("Shape", [self.batch_input], start=0, end=1)
        pieces = [self.const([v]) for v in values]
        for i, scale, offset in rules:
            pieces[i] = self.node("Add", [self.node("Mul", [self._batch, self.const([scale])]),
                                          self.const([offset])])
        return self.node("Concat", pieces, axis=0)

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        from onnx import numpy_helper

        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name


Rule = Callable[[Emitter, Node, list[str], str], str]
EXPORTS: dict[str, Rule] = {}


def _one(op: str) -> Rule:
    return lambda e, n, ins, out: e.node(op, ins, out)


for _t, _o in {"abs": "Abs", "cos": "Cos", "erf": "Erf", "exp": "Exp",
               "log": "Log", "neg": "Neg", "reciprocal": "Reciprocal", "relu": "Relu", "sigmoid": "Sigmoid",
               "sign": "Sign", "sin": "Sin", "sqrt": "Sqrt", "tan": "Tan", "tanh": "Tanh",
               "logical_not": "Not", "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
               "maximum": "Max", "minimum": "Min", "eq": "Equal", "lt": "Less", "le": "LessOrEqual",
               "gt": "Greater", "ge": "GreaterOrEqual", "logical_and": "And", "logical_or": "Or",
               "where": "Where", "matmul": "MatMul"}.items():
    EXPORTS[_t] = _one(_o)


def rule(*ops: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for o in ops:
            EXPORTS[o] = fn
        return fn
    return deco


@rule("ceil", "floor")
def _round(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    if not _is_float(n):  # of integers: themselves (ONNX's take floats only)
        return e.node("Identity", ins, out)
    return e.node("Ceil" if n.op == "ceil" else "Floor", ins, out)


@rule("ne")
def _ne(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Not", [e.node("Equal", ins)], out)


@rule("rsqrt")
def _rsqrt(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Reciprocal", [e.node("Sqrt", ins)], out)


@rule("square")
def _square(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Mul", [ins[0], ins[0]], out)


@rule("silu")
def _silu(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Mul", [ins[0], e.node("Sigmoid", ins)], out)


@rule("gelu")
def _gelu(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    d = _np_name(n.dtype)
    erf = e.node("Erf", [e.node("Mul", [ins[0], e.const(1 / np.sqrt(2), d)])])
    half = e.node("Mul", [ins[0], e.const(0.5, d)])
    return e.node("Mul", [half, e.node("Add", [erf, e.const(1.0, d)])], out)


@rule("floor_divide")
def _floor_divide(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    if _is_float(n):
        return e.node("Floor", [e.node("Div", ins)], out)
    # integers: ONNX's Div truncates; (a - a mod b) / b is exact and rounds down
    return e.node("Div", [e.node("Sub", [ins[0], e.node("Mod", ins)]), ins[1]], out)


@rule("remainder")
def _remainder(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    if not _is_float(n):
        return e.node("Mod", ins, out)
    q = e.node("Floor", [e.node("Div", ins)])
    return e.node("Sub", [ins[0], e.node("Mul", [q, ins[1]])], out)


@rule("cast")
def _cast(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    from onnx import helper

    return e.node("Cast", ins, out, to=helper.np_dtype_to_tensor_dtype(np.dtype(_np_name(n.attrs["dtype"]))))


def _np_name(d: str) -> Any:
    return dt.BY_NAME[d].np


def _is_float(n: Node) -> bool:
    return dt.BY_NAME[n.dtype].is_float


@rule("softmax", "log_softmax")
def _softmax(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    op = "Softmax" if n.op == "softmax" else "LogSoftmax"
    if not n.shape:  # ONNX's need a dimension: over a 1-element vector
        y = e.node(op, [e.node("Reshape", [ins[0], e.const([1])])], axis=0)
        return e.node("Reshape", [y, e.const([], np.int64)], out)
    return e.node(op, ins, out, axis=n.attrs["axis"])


_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin",
           "prod": "ReduceProd", "logsumexp": "ReduceLogSumExp"}


def _reduce(e: Emitter, op: str, x: str, axes: Any, keep: bool, out: str | None = None) -> str:
    ins = [x] if axes is None else [x, e.const(list(axes))]
    return e.node(op, ins, out, keepdims=int(keep))


@rule(*_REDUCE)
def _reduction(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return _reduce(e, _REDUCE[n.op], ins[0], n.attrs["axes"], n.attrs["keepdims"], out)


@rule("var")
def _var(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    shape = e.shapes[ins[0]]
    axes = list(range(len(shape))) if n.attrs["axes"] is None else list(n.attrs["axes"])
    count = int(np.prod([shape[a] for a in axes]))
    mean = _reduce(e, "ReduceMean", ins[0], axes, True)
    d = e.node("Sub", [ins[0], mean])
    m = _reduce(e, "ReduceMean", e.node("Mul", [d, d]), axes, n.attrs["keepdims"])
    scale = count / max(count - n.attrs["ddof"], 1)
    return e.node("Mul", [m, e.const(scale, _np_name(n.dtype))], out)


@rule("argmax", "argmin")
def _argmax(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    op = "ArgMax" if n.op == "argmax" else "ArgMin"
    axis, x = n.attrs["axis"], ins[0]
    if axis is None:
        x, axis = e.node("Reshape", [x, e.const([-1])]), 0
    return e.node(op, [x], out, axis=axis, keepdims=int(n.attrs["keepdims"]))


@rule("reshape")
def _reshape(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    shape = list(n.attrs["shape"])
    # ONNX reads a 0 in the shape as "keep this dimension" unless allowzero is set
    return e.node("Reshape", [ins[0], e.ints(n, "shape")], out, **({"allowzero": 1} if 0 in shape else {}))


@rule("transpose")
def _transpose(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Transpose", ins, out, perm=list(n.attrs["perm"]))


@rule("broadcast_to")
def _broadcast(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Expand", [ins[0], e.ints(n, "shape")], out)


@rule("squeeze", "unsqueeze")
def _squeeze(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    axes = n.attrs["axes"]
    args = [ins[0]] if axes is None else [ins[0], e.const(list(axes))]
    return e.node("Squeeze" if n.op == "squeeze" else "Unsqueeze", args, out)


@rule("concat")
def _concat(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Concat", ins, out, axis=n.attrs["axis"])


@rule("stack")
def _stack(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    axis = e.const([n.attrs["axis"]])
    return e.node("Concat", [e.node("Unsqueeze", [i, axis]) for i in ins], out, axis=n.attrs["axis"])


@rule("slice")
def _slice(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    a = n.attrs
    k = len(a["starts"])
    return e.node("Slice", [ins[0], e.ints(n, "starts"), e.ints(n, "stops"),
                            e.const(list(range(k))), e.const(list(a["steps"]))], out)


@rule("flip")
def _flip(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    axes = list(range(len(n.shape))) if n.attrs["axes"] is None else list(n.attrs["axes"])
    return e.node("Slice", [ins[0], e.const([-1] * len(axes)), e.const([-END] * len(axes)),
                            e.const(axes), e.const([-1] * len(axes))], out)


@rule("gather")
def _gather(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Gather", ins, out, axis=n.attrs["axis"])


@rule("embedding")
def _embedding(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("Gather", ins, out, axis=0)


@rule("pad")
def _pad(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    pairs = n.attrs["pads"]
    pads = [p[0] for p in pairs] + [p[1] for p in pairs]
    return e.node("Pad", [ins[0], e.const(pads), e.const(n.attrs["value"], _np_name(n.dtype))], out)


@rule("one_hot")
def _one_hot(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    d = _np_name(n.attrs["dtype"])
    return e.node("OneHot", [ins[0], e.const([n.attrs["num_classes"]]), e.const([0, 1], d)], out, axis=-1)


@rule("dropout")
def _dropout(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    if n.attrs["training"]:
        raise Unsupported("dropout with training=True (a random mask): export the model in eval mode")
    return e.node("Identity", ins, out)


def _pads(a: Any) -> list[int]:
    ph, pw = a["padding"]
    return [ph, pw, ph, pw]


@rule("conv2d")
def _conv(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    a = n.attrs
    return e.node("Conv", ins, out, strides=list(a["stride"]), pads=_pads(a),
                  dilations=list(a["dilation"]), group=a["groups"])


@rule("max_pool2d", "avg_pool2d")
def _pool(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    a = n.attrs
    stride = list(a["stride"] or a["kernel"])
    kw: dict[str, Any] = {"count_include_pad": 1} if n.op == "avg_pool2d" else {}
    return e.node("MaxPool" if n.op == "max_pool2d" else "AveragePool", ins, out,
                  kernel_shape=list(a["kernel"]), strides=stride, pads=_pads(a), **kw)


@rule("batch_norm")
def _batch_norm(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    if n.attrs["training"]:
        raise Unsupported("batch_norm with training=True: export the model in eval mode")
    return e.node("BatchNormalization", ins, out, epsilon=n.attrs["eps"])


@rule("layer_norm")
def _layer_norm(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    return e.node("LayerNormalization", ins, out, axis=-n.attrs["normalized_ndim"], epsilon=n.attrs["eps"])


@rule("cross_entropy")
def _cross_entropy(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    a = n.attrs
    if a["label_smoothing"]:
        raise Unsupported("cross_entropy with label_smoothing: ONNX's SoftmaxCrossEntropyLoss has none")
    kw = {} if a["ignore_index"] is None else {"ignore_index": a["ignore_index"]}
    return e.node("SoftmaxCrossEntropyLoss", ins, out, reduction=a["reduction"], **kw)


@rule("mse_loss")
def _mse(e: Emitter, n: Node, ins: list[str], out: str) -> str:
    sq = e.node("Mul", [d := e.node("Sub", ins), d])
    red = n.attrs["reduction"]
    if red == "none":
        return e.node("Identity", [sq], out)
    return _reduce(e, "ReduceSum" if red == "sum" else "ReduceMean", sq, None, False, out)


# --- the graph ---------------------------------------------------------------------------------


# the attributes a batch rule may touch and stay dynamic in ONNX (they become input tensors there)
DYNAMIC_ATTRS = {("reshape", "shape"), ("broadcast_to", "shape"), ("full", "shape"),
                 ("slice", "starts"), ("slice", "stops")}


def _batch_rules(model: Model) -> dict[str, dict[str, list[tuple[int, int, int]]]] | None:
    """node -> attr -> [(index, scale, offset)] for a dynamic batch in ONNX, or None when
    the batch must stay fixed (not dynamic, or a rule on an attribute ONNX keeps static)."""
    if not model.manifest["batch"]["dynamic"]:
        return None
    out: dict[str, dict[str, list[tuple[int, int, int]]]] = {}
    for r in model.manifest["batch"]["rules"]:
        op = model.graph.nodes[r["node"]].op
        if (op, r["attr"]) not in DYNAMIC_ATTRS or len(r["path"]) != 1:
            return None
        entry = (r["path"][0], r["scale"], r["offset"])
        out.setdefault(r["node"], {}).setdefault(r["attr"], []).append(entry)
    return out


def to_onnx(model: Any, example_inputs: Any = None, path: str | os.PathLike[str] | None = None) -> Any:
    """``model`` (a ``tp.Model``, or a function/module traced on ``example_inputs``) as an
    ONNX ModelProto, also written to ``path`` when given. Raises :class:`Unsupported`
    naming the first node whose op has no ONNX form."""
    import onnx
    from onnx import helper

    if not isinstance(model, Model):
        if example_inputs is None:
            raise TypeError("to_onnx: a function or module needs example_inputs to be traced")
        model = trace_model(model, example_inputs, what="to_onnx")
    rules = _batch_rules(model)
    dynamic = rules is not None
    e = Emitter()
    batched = [s.name for s in model.signature.inputs if s.shape and s.shape[0] is None]
    e.batch_input = batched[0] if batched else None
    names: dict[str, str] = {}
    outputs = {nid: spec.name for nid, spec in zip(model.graph.outputs, model.signature.outputs)}
    for nid, node in model.graph.nodes.items():
        if node.op == "input":
            tensor = node.attrs["tensor"]
            if tensor.startswith("input:"):
                names[nid] = tensor.removeprefix("input:")
                e.shapes[names[nid]] = node.shape
            else:
                from onnx import numpy_helper

                key = tensor.removeprefix("param:")
                e.inits.append(numpy_helper.from_array(np.asarray(model.params[key]), key))
                names[nid] = key
                e.shapes[key] = node.shape
            continue
        out = outputs.get(nid, nid)
        e.rules = (rules or {}).get(nid, {})
        if node.op == "full" and e.rules:  # of the batch's size: made at run time
            from onnx import numpy_helper

            fill = numpy_helper.from_array(np.array([node.attrs["value"]], _np_name(node.dtype)))
            names[nid] = e.node("ConstantOfShape", [e.ints(node, "shape")], out, value=fill)
            continue
        if not node.inputs:  # a constant of the graph: computed here, stored as an initializer
            value = apply(node.op, [], **node.attrs).numpy()
            names[nid] = e.node("Identity", [e.const(value, value.dtype)], out)
            continue
        fn = EXPORTS.get(node.op)
        if fn is None:
            raise Unsupported(f"node {nid!r} ({node.op}): no ONNX form for triplane op {node.op!r} "
                              f"(exported ops: {', '.join(sorted(EXPORTS))})")
        names[nid] = fn(e, node, [names[i] for i in node.inputs], out)
        e.shapes[names[nid]] = node.shape
    for nid, name in outputs.items():
        if names[nid] != name:  # an output that is an input or another output
            e.node("Identity", [names[nid]], name)

    def info(spec: Any) -> Any:
        batch = "batch" if dynamic else model.manifest["batch"]["size"]
        dims = [batch if d is None else d for d in spec.shape]
        elem = helper.np_dtype_to_tensor_dtype(_np_name(spec.dtype))
        return helper.make_tensor_value_info(spec.name, elem, dims)

    graph = helper.make_graph(e.nodes, "triplane", [info(s) for s in model.signature.inputs],
                              [info(s) for s in model.signature.outputs], e.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="triplane", ir_version=8)
    onnx.checker.check_model(proto)
    if path is not None:
        onnx.save(proto, os.fspath(path))
    return proto
