"""The graph IR: lossless JSON/YAML round trips, canonical bytes independent of insertion
and attribute order, structure hashing, and the value rules of attributes."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triplane.proto.builder import Builder, Ref
from triplane.proto.errors import GraphError
from triplane.proto.ir import Attrs, Graph, Node, fits_json, freeze
from triplane.proto.validate import validate
from triplane.scheduler.compiler.dce import dce

_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64).filter(fits_json)
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    """Random valid graphs: DAGs of the core ops with random shapes and attributes."""
    b = Builder(prefix=draw(st.sampled_from(["n", "_x", "é", "节点"])))
    refs: list[Ref] = []
    dtype = draw(st.sampled_from(["float32", "float64", "float16"]))
    for _ in range(draw(st.integers(1, 3))):
        refs.append(b.op("input", tensor=draw(_TEXT), shape=draw(_SHAPES), dtype=dtype))
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["full", "unary", "binary", "scalar", "sum", "reshape",
                                     "transpose", "cast"]))
        x = draw(st.sampled_from(refs))
        if kind == "full":
            r = b.op("full", value=draw(_FLOATS | st.integers(-(2**53), 2**53)), shape=x.shape,
                     dtype=x.dtype.name)
        elif kind == "unary":
            r = b.op(draw(st.sampled_from(["exp", "log", "neg"])), x)
        elif kind == "binary":
            same = [y for y in refs if y.shape == x.shape and y.dtype == x.dtype]
            r = b.op(draw(st.sampled_from(["add", "sub", "mul", "div"])), x, draw(st.sampled_from(same)))
        elif kind == "scalar":
            c = b.op("full", value=draw(_FLOATS), shape=(), dtype=x.dtype.name)
            r = b.op(draw(st.sampled_from(["add", "mul"])), x, c)
        elif kind == "sum":
            nd = x.ndim
            axes = draw(st.lists(st.integers(-nd, nd - 1), unique_by=lambda a, nd=nd: a % max(nd, 1),
                                 max_size=nd)) if nd else []
            r = b.op("sum", x, axes=axes, keepdims=draw(st.booleans()))
        elif kind == "reshape":
            r = b.op("reshape", x, shape=(*x.shape, 1))
        elif kind == "transpose":
            r = b.op("transpose", x, perm=draw(st.permutations(range(x.ndim))))
        else:
            r = b.op("cast", x, dtype=draw(st.sampled_from(["float32", "float64", "int32", "bool"])))
            if not r.dtype.is_float:
                continue  # keep the pool float so binary ops find partners
        refs.append(r)
    outs = draw(st.lists(st.sampled_from(refs), min_size=1, max_size=3, unique_by=lambda r: r.id))
    return b.graph(outs)


def _shuffled(g: Graph, seed: int) -> Graph:
    """The same graph with nodes stored in another order and every attribute mapping
    built in another key order."""
    rnd = random.Random(seed)
    ids = list(g.nodes)
    rnd.shuffle(ids)
    nodes = {}
    for k in ids:
        n = g.nodes[k]
        items = list(n.attrs.items())
        rnd.shuffle(items)
        nodes[k] = Node(n.op, n.inputs, Attrs(items), n.shape, n.dtype)
    return Graph(nodes, g.outputs)


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_json_round_trip_is_lossless(g: Graph) -> None:
    data = g.to_json()
    back = Graph.from_json(data)
    assert back == g
    assert back.to_json() == data
    assert back.hash() == g.hash()
    assert validate(back) == validate(g)


@settings(max_examples=40, deadline=None)
@given(graphs())
def test_yaml_round_trip_is_lossless(g: Graph) -> None:
    back = Graph.from_yaml(g.to_yaml())
    assert back == g
    assert back.to_json() == g.to_json()


@settings(max_examples=50, deadline=None)
@given(graphs(), st.integers(0, 2**32))
def test_canonical_bytes_ignore_insertion_and_attr_order(g: Graph, seed: int) -> None:
    other = _shuffled(g, seed)
    assert other.to_json() == g.to_json()
    assert other.hash() == g.hash()
    assert other.structure_hash() == g.structure_hash()
    assert other == g


@settings(max_examples=30, deadline=None)
@given(graphs())
def test_structure_hash_ignores_node_ids_and_bound_tensors(g: Graph) -> None:
    g = dce(g)  # dead nodes are ordered by id, so only live graphs are id-blind
    rename = {k: f"other{i}" for i, k in enumerate(reversed(list(g.nodes)))}
    nodes = {}
    for k, n in g.nodes.items():
        attrs = n.attrs.replace(tensor=n.attrs["tensor"] + "-v2") if n.op == "input" else n.attrs
        nodes[rename[k]] = n.replace(inputs=[rename[i] for i in n.inputs], attrs=attrs)
    h = Graph(nodes, tuple(rename[o] for o in g.outputs))
    assert h.structure_hash() == g.structure_hash()
    if any(n.op == "input" for n in g.nodes.values()):
        assert h.hash() != g.hash()


def test_structure_hash_sees_a_changed_attribute() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(2,), dtype="float32")
    g1 = b.graph([b.op("sum", x, axes=[0])])
    g2 = Graph({k: (n.replace(attrs=n.attrs.replace(keepdims=True), shape=(1,)) if n.op == "sum" else n)
                for k, n in g1.nodes.items()}, g1.outputs)
    assert g1.structure_hash() != g2.structure_hash()


def test_dataflow_order_ignores_storage_order() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(2,), dtype="float32")
    y = b.op("input", tensor="y", shape=(2,), dtype="float32")
    g = b.graph([b.op("add", b.op("exp", y), b.op("neg", x))])
    other = _shuffled(g, 7)
    assert other.dataflow_order() == g.dataflow_order()
    order = g.dataflow_order()
    for nid in order:
        assert all(order.index(i) < order.index(nid) for i in g.nodes[nid].inputs)


def test_attrs_are_frozen_and_order_insensitive() -> None:
    a = Attrs({"b": [1, [2.5, -3]], "a": {"z": "é", "y": None}})
    assert a["b"] == (1, (2.5, -3))
    assert isinstance(a["a"], Attrs)
    assert a == Attrs([("a", {"y": None, "z": "é"}), ("b", (1, (2.5, -3)))])
    assert hash(a) == hash(Attrs({"a": {"z": "é", "y": None}, "b": [1, [2.5, -3]]}))


def test_negative_zero_is_normalised_like_the_wire() -> None:
    # canonical JSON writes -0.0 as 0, so a graph holding -0.0 could not round-trip
    v = freeze(-0.0)
    assert v == 0 and math.copysign(1.0, v) == 1.0
    assert not fits_json(-0.0) and not fits_json(math.inf) and fits_json(0.0)


@pytest.mark.parametrize("bad", [b"x", "\ud800", {1, 2}, object()])
def test_unrepresentable_attribute_values_raise_graph_error(bad: object) -> None:
    with pytest.raises(GraphError):
        Attrs({"v": bad})


def test_non_string_attribute_name_raises_graph_error() -> None:
    with pytest.raises(GraphError, match="attribute names are strings"):
        Attrs({1: 2})  # type: ignore[dict-item]


def test_sdk_non_finite_and_negative_zero_scalars_compute_and_hash() -> None:
    import numpy as np

    from triplane.sdk.tensor import Tensor, build_graph

    x = Tensor.from_array(np.array([1.0, -2.0, 0.0], np.float32))
    ys = [x * math.inf, x * -0.0, x + math.nan]
    for y in ys:
        build_graph([y])[0].hash()  # serialisable: these scalars travel as constant nodes
    with np.errstate(invalid="ignore"):
        want = [np.float32([1, -2, 0]) * np.float32(v) for v in (math.inf, -0.0)]
    np.testing.assert_array_equal(ys[0].numpy(), want[0])
    np.testing.assert_array_equal(np.signbit(ys[1].numpy()), np.signbit(want[1]))
    assert np.isnan(ys[2].numpy()).all()


def test_yaml_aliases_are_refused() -> None:
    doc = ("a: &x [1, 2]\n")
    with pytest.raises(GraphError, match="alias"):
        Graph.from_yaml("nodes: {}\noutputs: *x\n" + doc.replace("a:", "version:"))


def test_large_integral_double_round_trips_as_a_double() -> None:
    b = Builder()
    v = 6.327590946445025e16  # written "63275909464450250" in canonical JSON
    g = b.graph([b.op("full", value=v, shape=(), dtype="float64")])
    assert b"63275909464450250" in g.to_json()
    back = Graph.from_json(g.to_json())
    (node,) = back.nodes.values()
    assert node.attrs["value"] == v and isinstance(node.attrs["value"], float)


def test_integers_beyond_2_53_cannot_be_hashed_or_parsed() -> None:
    g = Graph({"c": Node("full", (), Attrs({"value": 2**60, "shape": (), "dtype": "int64"}), (), "int64")},
              ("c",))
    with pytest.raises(GraphError, match="2\\*\\*53"):
        g.hash()
    with pytest.raises(GraphError, match="2\\*\\*53"):
        Graph.from_yaml(g.to_yaml())


def test_from_yaml_refuses_deep_nesting_without_crashing() -> None:
    # libyaml's composer would recurse in C and kill the process on this.
    with pytest.raises(GraphError, match="nests deeper than"):
        Graph.from_yaml("[" * 30000 + "]" * 30000)
