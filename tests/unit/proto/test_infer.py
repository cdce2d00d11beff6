"""Inference of a submitted graph's types (proto/infer.py) and gradients asked by a job
(autograd.named_gradients): a document without shapes completes to the very graph a typed
one is, errors name the node, op, input types and loc, and the named gradients compute what
the SDK's tp.grad computes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import triplane as tp
from triplane.engines.op.numpy_engine import NumpyEngine
from triplane.proto.autograd import GRAD_PREFIX, check_grad_request, named_gradients
from triplane.proto.errors import AttrError, DTypeError, GraphError, NotDifferentiableError, ShapeError
from triplane.proto.infer import MAX_LOC_LENGTH, add_locs, graph_from_wire, type_of
from triplane.proto.ir import Graph, encode_data
from triplane.proto.validate import validate

VECTORS = Path(__file__).parents[3] / "proto" / "vectors" / "graphs"


def untyped(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "nodes": {k: {f: v for f, v in n.items() if f not in ("shape", "dtype")}
                             for k, n in doc["nodes"].items()}}


@pytest.mark.parametrize("name", ["mlp", "shapes", "numbers"])
def test_a_document_without_types_completes_to_the_typed_graph(name: str) -> None:
    doc = json.loads((VECTORS / f"{name}.json").read_bytes())
    typed = validate(Graph.from_dict(doc))
    bare = untyped(doc)
    assert all("shape" not in n for n in bare["nodes"].values())
    assert validate(graph_from_wire(bare)).to_json() == typed.to_json()
    located = {**bare, "nodes": {k: {**n, "loc": f"x.go:{i}"}
                                 for i, (k, n) in enumerate(bare["nodes"].items())}}
    assert validate(graph_from_wire(located)).hash() == typed.hash()  # loc is no part of the graph


def test_a_typed_document_is_parsed_as_from_dict_parses_it() -> None:
    doc = json.loads((VECTORS / "mlp.json").read_bytes())
    assert graph_from_wire(doc) == Graph.from_dict(doc)


def _doc(**nodes: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": nodes, "outputs": [list(nodes)[-1]]}


def _full(shape: list[int], dtype: str = "float32", **extra: Any) -> dict[str, Any]:
    return {"op": "full", "attrs": {"value": 1, "shape": shape, "dtype": dtype}, **extra}


def test_a_shape_error_names_node_op_input_types_and_loc() -> None:
    doc = _doc(x=_full([2, 3]), w=_full([4, 5]),
               y={"op": "matmul", "inputs": ["x", "w"], "loc": "train.go:42"})
    with pytest.raises(ShapeError) as e:
        graph_from_wire(doc)
    assert (e.value.node, e.value.op, e.value.where, e.value.kind) == ("y", "matmul", "train.go:42", "shape")
    msg = str(e.value)
    assert msg.startswith("node 'y' (matmul): ") and msg.endswith("(at train.go:42)")
    assert "inputs float32[2, 3], float32[4, 5]" in msg


@pytest.mark.parametrize(("node", "error", "words"), [
    ({"op": "add", "inputs": ["a", "b"], "shape": [3], "loc": "m.js:7"}, ShapeError, "declared shape [3]"),
    ({"op": "add", "inputs": ["a", "b"], "dtype": "int32", "loc": "m.js:7"}, DTypeError,
     "declared dtype int32"),
    ({"op": "sum", "inputs": ["a"], "attrs": {"axes": 5}, "loc": "m.js:7"}, ShapeError, "out of range"),
    ({"op": "sum", "inputs": ["a"], "attrs": {"axis": 0}, "loc": "m.js:7"}, AttrError, "unknown attribute"),
    ({"op": "nope", "inputs": ["a"], "loc": "m.js:7"}, GraphError, "unknown op 'nope'"),
    ({"op": "exp", "inputs": ["a", "b"], "loc": "m.js:7"}, GraphError, "takes 1 input(s)"),
])
def test_each_inference_error_is_located(node: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error) as e:
        graph_from_wire(_doc(a=_full([2]), b=_full([2]), z=node))
    assert (e.value.node, e.value.where) == ("z", "m.js:7")
    assert words in str(e.value) and "(at m.js:7)" in str(e.value)


def test_an_error_in_a_source_node_names_its_loc_too() -> None:
    doc = _doc(a={"op": "full", "attrs": {"value": 1}, "loc": "s.py:1"})
    with pytest.raises(AttrError,
                       match=r"node 'a' \(full\): missing required attribute 'shape' \(at s.py:1\)"):
        graph_from_wire(doc)


@pytest.mark.parametrize("loc", ["", 5, "x" * 257, "a\nb"])
def test_a_bad_loc_is_refused(loc: Any) -> None:
    with pytest.raises(GraphError) as e:
        graph_from_wire(_doc(a=_full([2], loc=loc)))
    assert e.value.node == "a"


def test_the_locs_a_document_carries_are_handed_back() -> None:
    locs: dict[str, str] = {}
    g = graph_from_wire(_doc(a=_full([2], loc="s.py:1"), b={"op": "exp", "inputs": ["a"]}), locs=locs)
    assert locs == {"a": "s.py:1"} and set(g.nodes) == {"a", "b"}


def test_an_sdk_adds_locs_that_the_scheduler_accepts() -> None:
    doc = _doc(a=_full([2]), b={"op": "exp", "inputs": ["a"]}, c={"op": "tanh", "inputs": ["b"]},
               i={"op": "input", "attrs": {"tensor": "u", "shape": [2], "dtype": "float32"}})
    long = "/" + "d" * 400 + "/train.py:7"
    add_locs(doc["nodes"], [("a", "a.py:1"), ("b", long), ("c", "bad\nline.py:3"), ("i", "i.py:4"),
                            ("gone", "x.py:5")])
    nodes = doc["nodes"]
    assert nodes["a"]["loc"] == "a.py:1" and "loc" not in nodes["c"] and "loc" not in nodes["i"]
    assert len(nodes["b"]["loc"]) == MAX_LOC_LENGTH and nodes["b"]["loc"].endswith("/train.py:7")
    locs: dict[str, str] = {}
    graph_from_wire(doc, locs=locs, bound=lambda t: type_of((2,), "float32"))
    assert locs == {"a": "a.py:1", "b": nodes["b"]["loc"]}


def test_an_input_takes_the_type_of_the_tensor_it_binds() -> None:
    known = {"u1": type_of((3, 2), "int32")}
    doc = _doc(x={"op": "input", "attrs": {"tensor": "u1"}}, y={"op": "neg", "inputs": ["x"]})
    g = graph_from_wire(doc, bound=known.get)
    assert (str(g["y"].type), g["x"].attrs["shape"]) == ("int32[3, 2]", (3, 2))
    with pytest.raises(GraphError, match="'u2' is not a known upload or ref") as e:
        graph_from_wire(_doc(x={"op": "input", "attrs": {"tensor": "u2"}, "loc": "a:1"}), bound=known.get)
    assert (e.value.node, e.value.where) == ("x", "a:1")
    with pytest.raises(AttrError, match="missing required attribute 'shape'"):  # nothing to bind by
        graph_from_wire(_doc(x={"op": "input", "attrs": {"tensor": "u1"}}))


def _run(g: Graph, names: list[str]) -> list[np.ndarray]:
    eng, vals = NumpyEngine(), {}
    g = validate(g)
    for nid, n in g.nodes.items():
        vals[nid] = eng.run(n.op, [vals[i] for i in n.inputs], n.attrs, n.type)
    return [np.asarray(vals[n]) for n in names]


def test_named_gradients_compute_what_tp_grad_computes() -> None:
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (3, 5), (5,)])

    def const(a: np.ndarray) -> dict[str, Any]:
        return {"op": "constant",
                "attrs": {"data": encode_data(a), "shape": list(a.shape), "dtype": "float32"}}

    doc = _doc(x=const(x), w=const(w), b=const(b), h={"op": "matmul", "inputs": ["x", "w"]},
               z={"op": "add", "inputs": ["h", "b"]}, r={"op": "tanh", "inputs": ["z"]},
               loss={"op": "mean", "inputs": ["r"]})
    g, names = named_gradients(graph_from_wire(doc), "loss", ["w", "b", "x"])
    assert names == ["grad:w", "grad:b", "grad:x"] and g.outputs == ("loss", *names)
    got = _run(g, ["loss", *names])
    tx, tw, tb = (tp.Tensor.from_array(a) for a in (x, w, b))
    loss = tp.tanh(tx @ tw + tb).mean()
    want = [loss.numpy(), *(t.numpy() for t in tp.grad(loss, [tw, tb, tx]))]
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)


def test_gradients_that_share_a_node_each_get_their_name() -> None:
    doc = _doc(a=_full([2]), b=_full([2]), s={"op": "add", "inputs": ["a", "b"]},
               l={"op": "sum", "inputs": ["s"]})
    g, names = named_gradients(graph_from_wire(doc), "l", ["a", "b", "l"])
    assert [str(g[n].type) for n in names] == ["float32[2]", "float32[2]", "float32[]"]
    assert [a.tolist() for a in _run(g, names)] == [[1.0, 1.0], [1.0, 1.0], 1.0]


@pytest.mark.parametrize(("of", "wrt", "error", "words"), [
    ("l", ["nope"], GraphError, "'nope', which is not a node"),
    ("nope", ["a"], GraphError, "'nope', which is not a node"),
    ("l", ["a", "a"], GraphError, "names a node twice"),
    ("s", ["a"], NotDifferentiableError, "non-scalar"),
    ("l", ["i"], NotDifferentiableError, "only floating-point"),
])
def test_gradient_request_errors(of: str, wrt: list[str], error: type, words: str) -> None:
    doc = _doc(a=_full([2]), i=_full([2], "int32"), s={"op": "exp", "inputs": ["a"]},
               l={"op": "sum", "inputs": ["s"]})
    with pytest.raises(error, match=words):
        named_gradients(graph_from_wire(doc), of, wrt)


def test_a_node_named_like_a_gradient_is_refused() -> None:
    doc = _doc(a=_full([]), **{GRAD_PREFIX + "a": _full([])}, l={"op": "exp", "inputs": ["a"]})
    with pytest.raises(GraphError, match="that name is the gradient's"):
        named_gradients(graph_from_wire(doc), "l", ["a"])


@pytest.mark.parametrize("value", [None, {"of": "l"}, {"of": "l", "wrt": []}, {"of": "l", "wrt": "a"},
                                   {"of": "", "wrt": ["a"]}, {"of": "l", "wrt": ["a/b"]},
                                   {"of": "l", "wrt": ["w" * 125]}, {"of": "l", "wrt": ["a"], "x": 1}])
def test_a_malformed_grad_field_is_refused(value: Any) -> None:
    with pytest.raises(GraphError):
        check_grad_request(value)
    assert check_grad_request({"of": "l", "wrt": ["a", "b"]}) == ("l", ["a", "b"])
