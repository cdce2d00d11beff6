"""Running an ONNX graph on triplane Tensors, and importing it as a ``tp.Model``.

:func:`interpret` walks an ONNX graph's nodes in order, calling each operator's function
(``import_ops.py``, ``import_shape.py``) on lazy triplane Tensors: what it records is a
triplane graph. :func:`from_onnx` traces that into a :class:`~triplane.sdk.model.Model`
(the initializers become its named parameters; the batch is found as ``save_model``
finds it), which can be called, saved as a model file, or exported back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from triplane.sdk.model import Model, build_model
from triplane.sdk.onnx import import_nn, import_shape  # noqa: F401  (fill OPS with their operators)
from triplane.sdk.onnx.import_ops import OPS, Node, Unsupported, onnx_dtype
from triplane.sdk.tensor import Tensor

__all__ = ["check_supported", "from_onnx", "interpret", "supported_ops"]

DOMAINS = ("", "ai.onnx")


def supported_ops() -> list[str]:
    """The ONNX operators (default domain) triplane imports, sorted."""
    return sorted(OPS)


def _load(model: Any) -> Any:
    import onnx

    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    return model


def opset_of(model: Any) -> int:
    for o in model.opset_import:
        if o.domain in DOMAINS:
            return int(o.version)
    return 1


def check_supported(model: Any) -> None:
    """Raise :class:`Unsupported` naming every operator of ``model`` (an ONNX ModelProto)
    that triplane does not import, with the nodes that use it."""
    missing: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.domain not in DOMAINS or node.op_type not in OPS:
            key = node.op_type if node.domain in DOMAINS else f"{node.domain}.{node.op_type}"
            missing.setdefault(key, []).append(node.name or node.output[0])
    if missing:
        listed = "; ".join(f"{op} (node {', '.join(map(repr, nodes[:3]))})"
                           for op, nodes in sorted(missing.items()))
        raise Unsupported(f"ONNX operator(s) not supported by triplane: {listed}. triplane imports "
                          f"{len(OPS)} ONNX operators: triplane.sdk.onnx.supported_ops() lists them")


def _attr(a: Any) -> Any:
    from onnx import AttributeProto, helper, numpy_helper

    if a.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR):
        raise Unsupported(f"ONNX attribute {a.name!r} holds a graph or a sparse tensor")
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def initializers(graph: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in graph.initializer}


def interpret(graph: Any, feeds: Mapping[str, Tensor], opset: int,
              consts: Mapping[str, Tensor] | None = None) -> list[Tensor]:
    """The outputs of the ONNX ``graph`` on ``feeds`` (input name -> Tensor), recorded as
    triplane ops. ``consts`` (name -> Tensor) stand for the initializers (made from the
    graph when not given)."""
    env: dict[str, Tensor] = dict(consts) if consts is not None else {
        k: Tensor.from_array(v) for k, v in initializers(graph).items()}
    env.update(feeds)
    for node in graph.node:
        fn = OPS.get(node.op_type) if node.domain in DOMAINS else None
        if fn is None:
            raise Unsupported(f"ONNX operator {node.op_type!r} (node {node.name or node.output[0]!r}) "
                              "is not supported by triplane")
        try:
            ins = [env[i] if i else None for i in node.input]
        except KeyError as e:
            raise Unsupported(f"ONNX node {node.name!r} reads {e.args[0]!r}, which no node makes") from None
        n = Node(node.op_type, {a.name: _attr(a) for a in node.attribute}, opset, node.name, len(node.output))
        out = fn(n, *ins)
        outs = out if isinstance(out, (list, tuple)) else [out]
        for k, name in enumerate(node.output):
            if name and k >= len(outs):
                raise Unsupported(f"ONNX {node.op_type}: output {k} ({name!r}) is not supported")
            if name:
                env[name] = outs[k]
    return [env[o.name] for o in graph.output]


def graph_inputs(graph: Any) -> list[Any]:
    """The graph's real inputs (older models also list their initializers as inputs)."""
    inits = {i.name for i in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def from_onnx(model: Any, example_inputs: Sequence[Any] | None = None) -> Model:
    """Import an ONNX model (a ModelProto, a path or its bytes) as a ``tp.Model``.

    ``example_inputs`` fix the shapes to trace at; by default each input's declared shape,
    with a symbolic or unknown dimension 0 taken as a batch of 2 (any other unknown
    dimension needs an example). An operator triplane lacks raises :class:`Unsupported`
    naming it."""
    model = _load(model)
    check_supported(model)
    opset = opset_of(model)
    g = model.graph
    ins = graph_inputs(g)
    if example_inputs is None:
        example_inputs = [_example(i) for i in ins]
    consts = {k: Tensor.from_array(v) for k, v in initializers(g).items()}
    names = [i.name for i in ins]

    def fn(*xs: Tensor) -> tuple[Tensor, ...]:
        return tuple(interpret(g, dict(zip(names, xs)), opset, consts))

    params = {id(t): k for k, t in consts.items()}
    out_names = [o.name for o in g.output]
    return build_model(fn, list(example_inputs), names={"inputs": names, "outputs": out_names},
                       param_names=params)


def _example(vi: Any) -> np.ndarray:
    tt = vi.type.tensor_type
    d = onnx_dtype(tt.elem_type)
    dims = []
    for i, dim in enumerate(tt.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif i == 0:
            dims.append(2)
        else:
            raise ValueError(f"from_onnx: input {vi.name!r} has an unknown dimension {i}: pass "
                             "example_inputs")
    return np.zeros(dims, d.np)
