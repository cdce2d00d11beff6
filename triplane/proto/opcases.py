"""The cases ``proto/vectors/shapes/`` is generated from: for every op of the table, input
types and attributes whose expected result (a type, or an error kind) the Python op table
computes (``triplane.proto.export``). Broadcasting, empty and 0-d tensors, negative axes,
defaults and each refused dtype are among them, so that the Go and JavaScript SDKs check
their inference against the reference's.

A case is ``(inputs, attrs)``; an input is written ``"f32[2,3]"`` (see :func:`parse_type`).
Group rules (:func:`cases_for`) give the elementwise and reduction ops theirs; the other
ops list their own in ``_OWN``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.ir import TensorType, encode_data

__all__ = ["ABBREV", "Case", "cases_for", "parse_type"]

Case = tuple[list[str], dict[str, Any]]

ABBREV = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i8": "int8",
          "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "b": "bool"}


def parse_type(text: str) -> TensorType:
    """``"f32[2,3]"`` -> float32 of shape (2, 3); ``"i64[]"`` is 0-d."""
    name, _, dims = text.partition("[")
    shape = tuple(int(d) for d in dims.rstrip("]").split(",") if d)
    return TensorType(shape, dt.dtype(ABBREV[name]))


def _short(dtype: str) -> str:
    return {v: k for k, v in ABBREV.items()}[dtype]


def _one_of_each(op: str, shape: str = "[3]", arity: int = 1) -> list[Case]:
    """One case per dtype: accepted ones infer, the others are each a dtype error."""
    return [([f"{_short(d)}{shape}"] * arity, {}) for d in dt.BY_NAME]


def _unary(op: str) -> list[Case]:
    f = "f32" if "float32" in optable.get(op).dtypes else "b"
    return [([f"{f}[]"], {}), ([f"{f}[2,3]"], {}), ([f"{f}[0,4]"], {}), ([f"{f}[1,1,1,5]"], {}),
            *_one_of_each(op)]


def _binary(op: str) -> list[Case]:
    f = "f32" if "float32" in optable.get(op).dtypes else "b"
    shapes = [("[2,3]", "[2,3]"), ("[2,3]", "[3]"), ("[2,1]", "[1,4]"), ("[]", "[5]"), ("[5]", "[]"),
              ("[0,3]", "[1,3]"), ("[4,1,3]", "[2,1]"), ("[2,3]", "[4]"), ("[2,3]", "[3,2]"),
              ("[0]", "[2]")]
    other = "i32" if f == "f32" else "f32"
    return [*[([f + a, f + b], {}) for a, b in shapes], ([f"{f}[3]", f"{other}[3]"], {}),
            *_one_of_each(op, arity=2)]


_X = "f32[2,3,4]"


def _reduce(op: str) -> list[Case]:
    cases: list[Case] = [([_X], {}), ([_X], {"axes": 1}), ([_X], {"axes": [0, 2]}), ([_X], {"axes": -1}),
                         ([_X], {"axes": [2, -1]}), ([_X], {"axes": 3}),
                         ([_X], {"axes": None, "keepdims": True}),
                         ([_X], {"axes": [1], "keepdims": True}), (["f32[]"], {}),
                         (["f32[0,3]"], {"axes": 0}),
                         ([_X], {"axes": "1"}), ([_X], {"axis": 1}), *_one_of_each(op, "[2,3]")]
    if op == "var":
        cases += [([_X], {"axes": 2, "ddof": 1})]
    return cases


def _arg(op: str) -> list[Case]:
    return [([_X], {}), ([_X], {"axis": 1}), ([_X], {"axis": -1, "keepdims": True}), ([_X], {"axis": 3}),
            (["f32[]"], {}), ([_X], {"axis": [0, 1]}), *_one_of_each(op, "[2,3]")]


def _const(shape: list[int], dtype: str = "float32") -> dict[str, Any]:
    import numpy as np

    return {"data": encode_data(np.zeros(shape, dt.dtype(dtype).np)), "shape": shape, "dtype": dtype}


_IMG, _W = "f32[2,3,8,8]", "f32[4,3,3,3]"

_OWN: Mapping[str, list[Case]] = {
    "input": [([], {"tensor": "u1", "shape": [2, 3]}), ([], {"tensor": "u1", "shape": [], "dtype": "int64"}),
              ([], {"tensor": "u1"}), ([], {"tensor": "u1", "shape": [2], "dtype": "float8"}),
              ([], {"tensor": "u1", "shape": [-1]}), (["f32[2]"], {"tensor": "u1", "shape": [2]})],
    "constant": [([], _const([2, 2])), ([], _const([], "int32")), ([], {**_const([2]), "shape": [3]}),
                 ([], {**_const([2]), "data": "not base64!"}), ([], _const([0, 3]))],
    "full": [([], {"value": 1.5, "shape": [2, 3]}), ([], {"value": 7, "shape": [4], "dtype": "int32"}),
             ([], {"value": True, "shape": [], "dtype": "bool"}), ([], {"value": "x", "shape": [2]}),
             ([], {"value": 0, "shape": [0, 5]}), ([], {"shape": [2]}),
             ([], {"value": 0, "shape": [2], "x": 1})],
    "arange": [([], {"stop": 5}), ([], {"start": 1, "stop": 10, "step": 3}), ([], {"stop": 1, "step": 0.25,
               "dtype": "float32"}), ([], {"start": 5, "stop": 0, "step": -1}), ([], {"start": 5, "stop": 0}),
               ([], {"stop": 5, "step": 0}), ([], {})],
    "eye": [([], {"n": 3}), ([], {"n": 2, "m": 4, "k": 1, "dtype": "int32"}), ([], {"n": 0}),
            ([], {"n": -1})],
    "uniform": [([], {"shape": [2, 3], "seed": 1}), ([], {"shape": [4], "seed": 1, "low": -1, "high": 1}),
                ([], {"shape": [2, 2], "seed": 1, "full_shape": [4, 4], "start": [2, 0]}),
                ([], {"shape": [2], "seed": 1, "dtype": "int32"}), ([], {"shape": [2]})],
    "normal": [([], {"shape": [2, 3], "seed": 7}), ([], {"shape": [], "seed": 7, "mean": 1, "std": 2}),
               ([], {"shape": [3], "seed": 7, "dtype": "float64"}),
               ([], {"shape": [3], "seed": 7, "dtype": "int8"}),
               ([], {"seed": 7})],
    "where": [(["b[2,3]", "f32[2,3]", "f32[2,3]"], {}), (["b[2,1]", "f32[3]", "f32[]"], {}),
              (["b[3]", "i64[3]", "i64[3]"], {}), (["f32[3]", "f32[3]", "f32[3]"], {}),
              (["b[3]", "f32[3]", "i32[3]"], {}), (["b[2]", "f32[3]", "f32[3]"], {})],
    "cast": [(["f32[2,3]"], {"dtype": "int32"}), (["i64[]"], {"dtype": "float16"}),
             (["b[4]"], {"dtype": "float32"}),
             (["f32[2]"], {}), (["f32[2]"], {"dtype": "float8"})],
    "matmul": [(["f32[2,3]", "f32[3,4]"], {}), (["f32[3]", "f32[3,4]"], {}), (["f32[2,3]", "f32[3]"], {}),
               (["f32[3]", "f32[3]"], {}), (["f32[5,2,3]", "f32[3,4]"], {}),
               (["f32[5,1,2,3]", "f32[6,3,4]"], {}),
               (["f32[2,3]", "f32[4,5]"], {}), (["f32[]", "f32[3]"], {}), (["f32[2,3]", "i32[3,4]"], {}),
               (["f32[0,3]", "f32[3,4]"], {}), (["i64[2,2]", "i64[2,2]"], {}), (["b[2,2]", "b[2,2]"], {})],
    "softmax": [(["f32[2,5]"], {}), (["f32[2,5]"], {"axis": 0}), (["f32[2,5]"], {"axis": 2}), (["f32[]"], {}),
                (["i32[3]"], {})],
    "cross_entropy": [(["f32[4,10]", "i64[4]"], {}), (["f32[4,10]", "i64[4]"], {"reduction": "none"}),
                      (["f32[4,10]", "i64[4]"], {"reduction": "sum", "label_smoothing": 0.1}),
                      (["f32[4,10]", "f32[4,10]"], {}), (["f32[4,10]", "i64[5]"], {}),
                      (["f32[4,10]", "i64[4]"], {"reduction": "max"}),
                      (["f32[4,10]", "i64[4]"], {"ignore_index": -100})],
    "cross_entropy_grad": [(["f32[4,10]", "i64[4]", "f32[]"], {}), (["f32[4,10]", "i64[4]", "f32[4]"],
                                                                  {"reduction": "none"})],
    "mse_loss": [(["f32[4,3]", "f32[4,3]"], {}), (["f32[4,3]", "f32[4,3]"], {"reduction": "none"}),
                 (["f32[4,3]", "f32[3]"], {}), (["f32[4,3]", "f32[5,3]"], {})],
    "conv2d": [([_IMG, _W], {}), ([_IMG, _W], {"stride": [2, 2], "padding": [1, 1]}),
               ([_IMG, _W], {"dilation": [2, 2]}), (["f32[2,4,8,8]", "f32[6,2,3,3]"], {"groups": 2}),
               ([_IMG, "f32[4,2,3,3]"], {}), (["f32[3,8,8]", _W], {}), (["f32[2,3,2,2]", _W], {})],
    "conv2d_grad_input": [(["f32[2,4,6,6]", _W], {"input_shape": [2, 3, 8, 8]})],
    "conv2d_grad_weight": [([_IMG, "f32[2,4,6,6]"], {"weight_shape": [4, 3, 3, 3]})],
    "max_pool2d": [([_IMG], {"kernel": [2, 2]}),
                   ([_IMG], {"kernel": [3, 3], "stride": [1, 1], "padding": [1, 1]}),
                   ([_IMG], {}), (["f32[8,8]"], {"kernel": [2, 2]})],
    "max_pool2d_grad": [([_IMG, "f32[2,3,4,4]"], {"kernel": [2, 2]})],
    "avg_pool2d_grad": [(["f32[2,3,4,4]"], {"kernel": [2, 2], "input_shape": [2, 3, 8, 8]})],
    "embedding": [(["f32[10,4]", "i64[2,3]"], {}), (["f32[10,4]", "i32[]"], {}),
                  (["f32[10,4]", "f32[3]"], {}),
                  (["f32[10]", "i64[3]"], {})],
    "embedding_grad": [(["i64[2,3]", "f32[2,3,4]"], {"num_embeddings": 10})],
    "one_hot": [(["i64[4]"], {"num_classes": 3}), (["i32[2,2]"], {"num_classes": 5, "dtype": "int64"}),
                (["f32[4]"], {"num_classes": 3}), (["i64[4]"], {})],
    "dropout": [(["f32[4,5]"], {"seed": 3}), (["f32[4,5]"], {"seed": 3, "p": 0.1, "training": False}),
                (["f32[4,5]"], {}), (["i32[4]"], {"seed": 3})],
    "layer_norm": [(["f32[2,5]", "f32[5]", "f32[5]"], {}), (["f32[2,3,4]", "f32[3,4]", "f32[3,4]"],
                                                            {"normalized_ndim": 2}),
                   (["f32[2,5]", "f32[4]", "f32[4]"], {})],
    "batch_norm": [(["f32[8,3,4,4]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"], {}),
                   (["f32[8,3]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"], {"training": True}),
                   (["f32[8,3]", "f32[4]", "f32[3]", "f32[3]", "f32[3]"], {})],
    "reshape": [(["f32[2,3]"], {"shape": [3, 2]}), (["f32[2,3]"], {"shape": [6]}),
                (["f32[]"], {"shape": [1, 1]}),
                (["f32[2,3]"], {"shape": [4]}), (["f32[0,3]"], {"shape": [3, 0]}), (["f32[2,3]"], {})],
    "transpose": [(["f32[2,3,4]"], {"perm": [2, 0, 1]}), (["f32[2,3]"], {"perm": [1, 0]}),
                  (["f32[2,3]"], {"perm": [0, 0]}), (["f32[2,3]"], {"perm": [1]})],
    "broadcast_to": [(["f32[3]"], {"shape": [2, 3]}), (["f32[2,1]"], {"shape": [2, 4]}),
                     (["f32[]"], {"shape": [5]}),
                     (["f32[2,3]"], {"shape": [3]}), (["f32[2]"], {"shape": [2, 3]})],
    "squeeze": [(["f32[1,3,1]"], {}), (["f32[1,3,1]"], {"axes": 0}), (["f32[1,3,1]"], {"axes": [-1]}),
                (["f32[1,3,1]"], {"axes": 1})],
    "unsqueeze": [(["f32[3]"], {"axes": 0}), (["f32[3]"], {"axes": [0, 2]}), (["f32[3]"], {"axes": -1}),
                  (["f32[3]"], {"axes": 5}), (["f32[3]"], {})],
    "concat": [(["f32[2,3]", "f32[4,3]"], {}), (["f32[2,3]", "f32[2,1]"], {"axis": 1}), (["f32[2,3]"], {}),
               (["f32[2,3]", "f32[2,4]"], {}), (["f32[2]", "i32[2]"], {}), ([], {})],
    "stack": [(["f32[2,3]", "f32[2,3]"], {}), (["f32[2,3]", "f32[2,3]", "f32[2,3]"], {"axis": -1}),
              (["f32[2,3]", "f32[3,2]"], {}), (["f32[]", "f32[]"], {})],
    "slice": [(["f32[10,4]"], {"starts": [2, 0], "stops": [8, 4], "steps": [2, 1]}),
              (["f32[10]"], {"starts": [0], "stops": [10], "steps": [3]}),
              (["f32[10]"], {"starts": [5], "stops": [2], "steps": [1]}),
              (["f32[10]"], {"starts": [0], "stops": [20], "steps": [1]}),
              (["f32[10,4]"], {"starts": [0], "stops": [1], "steps": [1]})],
    "unslice": [(["f32[3,4]"], {"shape": [10, 4], "starts": [2, 0], "stops": [8, 4], "steps": [2, 1]})],
    "gather": [(["f32[10,4]", "i64[3]"], {}), (["f32[10,4]", "i64[2,2]"], {"axis": 1}),
               (["f32[10,4]", "f32[3]"], {}), (["f32[10,4]", "i64[3]"], {"axis": 2})],
    "scatter_add": [(["f32[3,4]", "i64[3]"], {"axis": 0, "size": 10})],
    "pad": [(["f32[2,3]"], {"pads": [[1, 1], [0, 2]]}), (["f32[2,3]"], {"pads": [[1, 1]]}),
            (["f32[2]"], {"pads": [[0, 0]], "value": 5}),
            (["f32[2]"], {"pads": [[0, 0]], "mode": "reflect"})],
    "flip": [(["f32[2,3]"], {}), (["f32[2,3]"], {"axes": 1}), (["f32[2,3]"], {"axes": 2})],
    "fused": [(["f32[2,3]", "f32[3]"], {"program": [["add", [0, 1], {}], ["exp", [2], {}]]}),
              (["f32[2,3]"], {"program": [["exp", [0], {}], ["sum", [1], {"axes": [1]}]]}),
              (["f32[2,3]"], {"program": [["matmul", [0, 0], {}]]})],
}


def cases_for(op: str) -> list[Case]:
    """The vector cases of ``op`` (every op of the table has some)."""
    opdef = optable.get(op)
    if op in _OWN:
        return list(_OWN[op])
    if op in ("argmax", "argmin"):
        return _arg(op)
    if opdef.group == "reduce":
        return _reduce(op)
    if op in ("log_softmax",):
        return _OWN["softmax"]
    if op == "avg_pool2d":
        return _OWN["max_pool2d"]
    if opdef.elementwise and opdef.arity == 1:
        return _unary(op)
    if opdef.elementwise and opdef.arity == 2:
        return _binary(op)
    raise KeyError(f"no vector cases for op {op!r}: add them to triplane/proto/opcases.py")
