"""validate() and the document parsers reject bad graphs with GraphError subclasses whose
message names the node and op; garbage never escapes as KeyError/TypeError."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triplane.proto.builder import Builder
from triplane.proto.errors import (
    AttrError,
    DTypeError,
    GraphError,
    LimitError,
    ShapeError,
    TriplaneError,
    UnknownOpError,
)
from triplane.proto.ir import Graph, encode_data
from triplane.proto.validate import Limits, validate


def _doc() -> dict[str, Any]:
    """A small valid graph document: y = exp(x) + x."""
    return {"version": 1, "nodes": {
        "x": {"op": "input", "shape": [2, 3], "dtype": "float32",
              "attrs": {"tensor": "t1", "shape": [2, 3], "dtype": "float32"}},
        "e": {"op": "exp", "inputs": ["x"], "shape": [2, 3], "dtype": "float32"},
        "y": {"op": "add", "inputs": ["e", "x"], "shape": [2, 3], "dtype": "float32"},
    }, "outputs": ["y"]}


def _check(doc: dict[str, Any], limits: Limits | None = None) -> Graph:
    g = Graph.from_dict(doc)
    return validate(g, limits) if limits else validate(g)


def test_valid_document_passes_and_fills_defaults() -> None:
    doc = _doc()
    doc["nodes"]["s"] = {"op": "sum", "inputs": ["y"], "shape": [], "dtype": "float32"}
    doc["outputs"] = ["s"]
    g = _check(doc)
    assert g["s"].attrs == {"axes": None, "keepdims": False}
    assert list(g.nodes) == g.topo_order()


@pytest.mark.parametrize(("edit", "error", "node", "words"), [
    (lambda d: d["nodes"]["e"].update(op="frobnicate"), UnknownOpError, "e", "unknown op 'frobnicate'"),
    (lambda d: d["nodes"]["y"].update(inputs=["e"]), GraphError, "y", "takes 2 input(s), got 1"),
    (lambda d: d["nodes"]["y"].update(inputs=["e", "x", "x"]), GraphError, "y", "takes 2 input(s), got 3"),
    (lambda d: d["nodes"]["e"].update(attrs={"alpha": 1}), AttrError, "e", "unknown attribute(s) ['alpha']"),
    (lambda d: d["nodes"]["x"]["attrs"].pop("tensor"), AttrError, "x", "missing required attribute 'tensor'"),
    (lambda d: d["nodes"]["x"]["attrs"].update(tensor=5), AttrError, "x", "'tensor' must be a string"),
    (lambda d: d["nodes"]["e"].update(shape=[3, 2]), ShapeError, "e",
     "declared shape [3, 2] but the op gives [2, 3]"),
    (lambda d: d["nodes"]["e"].update(dtype="float64"), DTypeError, "e",
     "declared dtype float64 but the op gives float32"),
    (lambda d: d["nodes"]["x"].update(dtype="int32") or d["nodes"]["x"]["attrs"].update(dtype="int32"),
     DTypeError, "e", "input 0 has dtype int32"),
])
def test_bad_nodes_are_named(edit: Any, error: type[GraphError], node: str, words: str) -> None:
    doc = _doc()
    edit(doc)
    with pytest.raises(error) as info:
        _check(doc)
    op = doc["nodes"][node]["op"]
    assert info.value.node == node and info.value.op == op
    assert str(info.value).startswith(f"node {node!r} ({op}): ")
    assert words in str(info.value)


def test_operand_dtype_mismatch_is_a_dtype_error() -> None:
    doc = _doc()
    doc["nodes"]["z"] = {"op": "input", "shape": [2, 3], "dtype": "float64",
                         "attrs": {"tensor": "t2", "shape": [2, 3], "dtype": "float64"}}
    doc["nodes"]["y"]["inputs"] = ["e", "z"]
    with pytest.raises(DTypeError, match=r"node 'y' \(add\): operands have dtypes float32 and float64"):
        _check(doc)


def test_broadcast_shape_error_names_both_shapes() -> None:
    b = Builder()
    x = b.op("input", tensor="a", shape=(2, 3), dtype="float32")
    y = b.op("input", tensor="b", shape=(4,), dtype="float32")
    doc = b.graph([x, y]).to_dict()
    doc["nodes"]["bad"] = {"op": "mul", "inputs": [x.id, y.id], "shape": [2, 3], "dtype": "float32"}
    with pytest.raises(ShapeError, match=r"node 'bad' \(mul\): shapes \(2, 3\) and \(4,\) do not broadcast"):
        _check(doc)


def test_dangling_input_and_cycle_are_named() -> None:
    doc = _doc()
    doc["nodes"]["e"]["inputs"] = ["ghost"]
    with pytest.raises(GraphError, match=r"node 'e' \(exp\): input 'ghost' is not a node"):
        _check(doc)
    doc = _doc()
    doc["nodes"]["e"]["inputs"] = ["y"]
    with pytest.raises(GraphError, match=r"cycle through") as info:
        _check(doc)
    assert info.value.node in ("e", "y")


def test_limits() -> None:
    doc = _doc()
    with pytest.raises(LimitError, match="3 nodes, more than the limit of 2"):
        _check(doc, Limits(max_nodes=2))
    with pytest.raises(LimitError, match=r"node 'x' \(input\): tensor of shape \(2, 3\) has 6 elements"):
        _check(doc, Limits(max_elements=5))
    with pytest.raises(LimitError, match="3 nodes, more than the limit of 2"):
        Graph.from_json(json.dumps(doc), max_nodes=2)
    data = json.dumps(doc).encode()
    with pytest.raises(LimitError, match=f"graph document is {len(data)} bytes"):
        Graph.from_json(data, max_bytes=len(data) - 1)
    with pytest.raises(LimitError, match="bytes, more than the limit"):
        Graph.from_json("é" * 60, max_bytes=100)  # 120 bytes of UTF-8 in 60 characters


def test_constant_bytes_limit() -> None:
    import numpy as np

    data = encode_data(np.arange(300, dtype=np.float64))
    doc = {"nodes": {"c": {"op": "constant", "shape": [300], "dtype": "float64",
                           "attrs": {"data": data, "shape": [300], "dtype": "float64"}}},
           "outputs": ["c"]}
    assert _check(doc)["c"].shape == (300,)
    with pytest.raises(LimitError, match=r"node 'c' \(constant\): inline constant of 2400 bytes"):
        _check(doc, Limits(max_constant_bytes=2000))
    doc["nodes"]["c"]["attrs"]["data"] = data[:-8]
    with pytest.raises(AttrError, match="'data' holds"):
        _check(doc)


@pytest.mark.parametrize(("doc", "words"), [
    ([], "a graph is a mapping"),
    ({"nodes": [], "outputs": []}, "'nodes' must be a mapping"),
    ({"nodes": {}, "outputs": "y"}, "'outputs' must be a list"),
    ({"nodes": {}, "outputs": ["y"]}, "output 'y' is not a node"),
    ({"nodes": {}, "outputs": [], "extra": 1}, "unknown graph field"),
    ({"version": True, "nodes": {}, "outputs": []}, "unsupported graph version"),
    ({"version": 2, "nodes": {}, "outputs": []}, "unsupported graph version"),
    ({"nodes": {"a": 5}, "outputs": []}, "node 'a': a node is a mapping"),
    ({"nodes": {"a": {"op": 1}}, "outputs": []}, "'op' must be a string"),
    ({"nodes": {"a": {"op": "exp", "shape": [-1], "dtype": "float32"}}, "outputs": []}, "'shape' must be"),
    ({"nodes": {"a": {"op": "exp", "shape": [1.5], "dtype": "float32"}}, "outputs": []}, "'shape' must be"),
    ({"nodes": {"a": {"op": "exp", "shape": [True], "dtype": "float32"}}, "outputs": []}, "'shape' must be"),
    ({"nodes": {"a": {"op": "exp", "shape": "12", "dtype": "float32"}}, "outputs": []}, "'shape' must be"),
    ({"nodes": {"a": {"op": "exp", "shape": [], "dtype": "float8"}}, "outputs": []},
     "unknown dtype 'float8'"),
    ({"nodes": {"a": {"op": "exp", "shape": [], "dtype": ["x"]}}, "outputs": []}, "unknown dtype"),
    ({"nodes": {"a": {"op": "exp", "inputs": "b", "shape": [], "dtype": "float32"}}, "outputs": []},
     "'inputs' must be a list"),
    ({"nodes": {"a": {"op": "exp", "attrs": [], "shape": [], "dtype": "float32"}}, "outputs": []},
     "'attrs' must be a mapping"),
    ({"nodes": {"a": {"op": "full", "attrs": {"value": math.nan}, "shape": [], "dtype": "float32"}},
      "outputs": []}, "NaN and infinities"),
    ({"nodes": {"a": {"op": "full", "attrs": {"value": [1, {"k": -math.inf}]}, "shape": [],
                      "dtype": "float32"}}, "outputs": []}, "NaN and infinities"),
    ({"nodes": {"a": {"op": "exp", "colour": 1, "shape": [], "dtype": "float32"}}, "outputs": []},
     "unknown node field"),
    ({"nodes": {1: {"op": "exp", "shape": [], "dtype": "float32"}}, "outputs": []}, "node ids are strings"),
])
def test_malformed_documents(doc: Any, words: str) -> None:
    with pytest.raises(GraphError) as info:
        Graph.from_dict(doc)
    assert words in str(info.value)


@pytest.mark.parametrize(("text", "words"), [
    (b"{", "not valid JSON"), (b"\xff\xfe", "not valid JSON"), ("[1, 2]", "a graph is a mapping"),
    ('{"nodes": {"a": {"op": "full", "attrs": {"value": NaN}}}}', "NaN"),
    ('{"nodes": {}, "nodes": {}, "outputs": []}', "duplicate key 'nodes'"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_malformed_json(text: str | bytes, words: str) -> None:
    with pytest.raises(GraphError, match=words):
        Graph.from_json(text)


@pytest.mark.parametrize(("text", "words"), [
    ("nodes: [", "not valid YAML"), ("!!python/object:os.system {}", "not valid YAML"),
    ("nodes: {}\noutputs: []\nversion: !!binary aGk=", "unsupported graph version"),
    ("nodes: {a: {op: exp, shape: [], dtype: float32, attrs: {t: 2020-01-01}}}\noutputs: []", "cannot go in"),
])
def test_malformed_yaml(text: str, words: str) -> None:
    with pytest.raises(GraphError, match=words):
        Graph.from_yaml(text)


# --- fuzzing: only TriplaneError may escape ---------------------------------------------

_OPS = ["input", "full", "constant", "exp", "log", "neg", "add", "sub", "mul", "div", "cast", "sum",
        "matmul", "reshape", "transpose", "broadcast_to", "fused", "nope"]
_scalars = (st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats()
            | st.text(max_size=6) | st.sampled_from(["float32", "int64", "x", "y", "AAAA", "exp"]))
_junk = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=5) | st.sampled_from(["shape", "dtype", "value"]),
                                       inner, max_size=4), max_leaves=12)
_node = st.fixed_dictionaries({}, optional={
    "op": st.sampled_from(_OPS) | _junk,
    "inputs": st.lists(st.sampled_from(["x", "y", "z"]), max_size=3) | _junk,
    "attrs": st.dictionaries(st.sampled_from(["tensor", "shape", "dtype", "value", "data", "axes",
                                              "keepdims", "perm", "program"]), _junk, max_size=4) | _junk,
    "shape": st.lists(st.integers(-1, 4), max_size=3) | _junk,
    "dtype": st.sampled_from(["float32", "int32", "bool", "float16"]) | _junk,
})
_docs = st.fixed_dictionaries({}, optional={
    "version": st.just(1) | _junk,
    "nodes": st.dictionaries(st.sampled_from(["x", "y", "z"]), _node | _junk, max_size=3) | _junk,
    "outputs": st.lists(st.sampled_from(["x", "y", "z"]), max_size=2) | _junk,
}) | _junk


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_docs)
def test_fuzz_only_graph_errors_escape(doc: Any) -> None:
    try:
        g = validate(Graph.from_dict(doc))
        g.hash()
        Graph.from_yaml(g.to_yaml())
    except TriplaneError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_fuzz_bytes_only_graph_errors_escape(data: bytes | str) -> None:
    for parse in (Graph.from_json, Graph.from_yaml):
        with contextlib.suppress(TriplaneError):
            parse(data)
