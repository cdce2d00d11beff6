"""Split execution equals unsplit execution, for every op with a split rule.

Each case is one op ``y`` reading inputs ``x<i>`` through ``p<i> = reshape(x<i>)`` (an
op of its own, so the input can be produced already cut, in a way ``y`` may not want:
that exercises regroups). Every case runs unsplit and under three tilings, all through
executor/local.run_plan on the numpy engine:

* ``auto``: the sizing loop alone (no memory limit, at least 6 tasks per op);
* ``thirds``: every axis of ``y`` (contraction axes too: matmul's K, reduced axes) cut
  into tiles of ceil(n / 3) -- uneven edges whenever 3 does not divide n;
* ``misaligned``: every input produced in halves (ceil(n / 2)) and ``y`` cut in tiles of
  n // 3 + 1, so most tiles of ``y`` need slices and concats of its inputs' tiles.

Tolerances (float64 data): data-movement ops (shape ops, sources, random ops, dropout,
gather/embedding/one_hot) must be bit-identical; ops that compute are compared with
rtol = atol = 1e-12 (partial sums and K-split products add in another order; BLAS may
block a smaller matmul differently).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from triplane.proto import optable
from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.fusion import fuse_elementwise
from triplane.scheduler.compiler.tiling import TileSizes, tile_graph
from triplane.scheduler.compiler.tiling.rules import space_of

RTOL = ATOL = 1e-12
EXACT_KINDS = {"reshape", "transpose", "broadcast_to", "squeeze", "unsqueeze", "slice", "concat",
               "stack", "flip", "pad", "gather", "input", "full", "eye", "random", "dropout",
               "embedding", "one_hot"}

Make = Callable[[np.random.Generator], list[np.ndarray]]


@dataclass
class Case:
    op: str
    make: Make
    attrs: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def id(self) -> str:
        return self.label or self.op


def _f(*shape: int, lo: float = -2.0, hi: float = 2.0) -> Make:
    return lambda r: [r.uniform(lo, hi, size=shape)]


def _ff(a: tuple[int, ...], b: tuple[int, ...], lo: float = -2.0, hi: float = 2.0) -> Make:
    return lambda r: [r.uniform(lo, hi, size=a), r.uniform(lo, hi, size=b)]


def _bools(*shapes: tuple[int, ...]) -> Make:
    return lambda r: [r.random(s) < 0.5 for s in shapes]


def _ints(shape: tuple[int, ...], high: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, high, size=shape)


UNARY_POSITIVE = ["exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid",
                  "gelu", "silu", "erf", "neg", "abs", "sign", "square", "relu", "floor", "ceil"]
BINARY = ["add", "sub", "mul", "div", "floor_divide", "remainder", "maximum", "minimum", "eq", "ne", "lt",
          "le", "gt", "ge"]

CASES: list[Case] = [
    *[Case(op, _f(7, 5, lo=0.5, hi=2.0)) for op in UNARY_POSITIVE],
    Case("logical_not", _bools((7, 5))),
    *[Case(op, _ff((7, 5), (5,))) for op in BINARY],
    Case("pow", _ff((7, 5), (7, 1), lo=0.5, hi=2.0)),
    Case("logical_and", _bools((7, 5), (1, 5))),
    Case("logical_or", _bools((7, 5), (7, 5))),
    Case("where", lambda r: [r.random((7, 1)) < 0.5, r.normal(size=(7, 5)), r.normal(size=(5,))]),
    Case("cast", _f(7, 5), {"dtype": "float32"}),
    Case("fused", _f(7, 5)),  # built by the fusion pass, see _graph
    # fused programs ending in a reduction (attrs: the reduction's)
    Case("fused", _f(7, 5), {"reduce": "sum", "axes": None}, label="fused-sum-all"),
    Case("fused", _f(9, 7), {"reduce": "mean", "axes": 1}, label="fused-mean-rows"),
    Case("fused", _f(7, 5), {"reduce": "max", "axes": 0, "keepdims": True}, label="fused-max-cols"),
    Case("fused", _f(6, 7, 4), {"reduce": "min", "axes": (0, 2)}, label="fused-min-3d"),
    Case("fused", _ff((7, 5), (5,)), {"reduce": "sum", "axes": -1}, label="fused-sum-broadcast"),
    Case("input", lambda r: []),
    Case("full", lambda r: [], {"value": 1.5, "shape": (7, 5), "dtype": "float64"}),
    Case("eye", lambda r: [], {"n": 7, "m": 9, "k": 2, "dtype": "float64"}),
    Case("uniform", lambda r: [], {"shape": (7, 5, 3), "seed": 11, "dtype": "float64", "low": -1.0}),
    Case("normal", lambda r: [], {"shape": (9, 5), "seed": 12, "dtype": "float32", "offset": 4}),
    Case("matmul", _ff((7, 9), (9, 8))),
    Case("matmul", _ff((2, 5, 6), (6, 4)), label="matmul-batched"),
    Case("matmul", _ff((7,), (7, 5)), label="matmul-vector"),
    *[Case(op, _f(6, 7, 4, lo=0.9, hi=1.1), {"axes": (0, 2)})
      for op in ("sum", "prod", "max", "min", "mean")],
    Case("sum", _f(6, 7), {"axes": None, "keepdims": True}, label="sum-all-keepdims"),
    Case("mean", _f(9, 7), {"axes": 1}, label="mean-rows"),
    Case("max", _bools((6, 5)), {"axes": 0}, label="max-bool"),
    Case("logsumexp", _f(6, 7, 4), {"axes": (1,)}),
    Case("var", _f(6, 7, 4), {"axes": (0, 2), "ddof": 1, "keepdims": True}),
    Case("argmax", _f(6, 7, 4), {"axis": 1}),
    Case("argmin", _f(6, 7), {"axis": 0, "keepdims": True}),
    Case("softmax", _f(6, 7), {"axis": 1}),
    Case("log_softmax", _f(6, 7, 3), {"axis": 0}),
    Case("layer_norm", lambda r: [r.normal(size=(6, 4, 5)), r.normal(size=(5,)), r.normal(size=(5,))]),
    Case("conv2d", _ff((5, 3, 6, 6), (7, 3, 3, 3)), {"padding": (1, 1), "stride": (2, 1)}),
    Case("conv2d", _ff((5, 4, 6, 6), (6, 2, 3, 3)), {"groups": 2}, label="conv2d-groups"),
    Case("max_pool2d", _f(5, 3, 6, 6), {"kernel": (2, 2)}),
    Case("avg_pool2d", _f(5, 3, 7, 7), {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}),
    Case("embedding", lambda r: [r.normal(size=(10, 6)), _ints((4, 5), 10)]),
    Case("one_hot", lambda r: [_ints((7, 3), 5)], {"num_classes": 5}),
    Case("dropout", _f(7, 5), {"p": 0.3, "seed": 5}),
    Case("cross_entropy", lambda r: [r.normal(size=(9, 5)), _ints((9,), 5)], {"reduction": "mean"}),
    Case("cross_entropy", lambda r: [r.normal(size=(9, 5, 4)), _ints((9, 4), 5)],
         {"reduction": "none", "label_smoothing": 0.1}, label="cross_entropy-none"),
    Case("cross_entropy", lambda r: [r.normal(size=(9, 5)), _ints((9,), 5)],
         {"reduction": "sum", "ignore_index": 2}, label="cross_entropy-sum"),
    Case("mse_loss", _ff((7, 5), (5,)), {"reduction": "mean"}),
    Case("mse_loss", _ff((7, 5), (7, 5)), {"reduction": "none"}, label="mse_loss-none"),
    Case("batch_norm", lambda r: [r.normal(size=(6, 4, 5)), *(r.uniform(0.5, 2, size=4) for _ in range(4))],
         {"training": True}),
    Case("batch_norm", lambda r: [r.normal(size=(6, 4, 5)), *(r.uniform(0.5, 2, size=4) for _ in range(4))],
         {"training": False}, label="batch_norm-eval"),
    Case("reshape", _f(6, 4, 5), {"shape": (6, 20)}),
    Case("reshape", _f(2, 5, 3), {"shape": (10, 3)}, label="reshape-inner-anchor"),
    Case("transpose", _f(6, 4, 5), {"perm": (2, 0, 1)}),
    Case("broadcast_to", _f(7, 1), {"shape": (3, 7, 5)}),
    Case("squeeze", _f(7, 1, 5)),
    Case("unsqueeze", _f(7, 5), {"axes": (0, 2)}),
    Case("slice", _f(11, 8), {"starts": (1, 0), "stops": (10, 8), "steps": (2, 3)}),
    Case("concat", lambda r: [r.normal(size=(5, n)) for n in (2, 5, 3)], {"axis": 1}),
    Case("stack", lambda r: [r.normal(size=(5, 4)) for _ in range(3)], {"axis": 1}),
    Case("flip", _f(7, 5), {"axes": (0,)}),
    Case("pad", _f(7, 5), {"pads": ((2, 3), (0, 1)), "value": 0.5}),
    Case("gather", lambda r: [r.normal(size=(6, 8, 3)), _ints((4, 2), 8)], {"axis": 1}),
]


def _graph(case: Case, arrays: list[np.ndarray]) -> Graph:
    b = Builder()
    ps = []
    for i, a in enumerate(arrays):
        attrs = {"tensor": f"x{i}", "shape": a.shape, "dtype": a.dtype.name}
        x = b.add_node("input", [], attrs, node_id=f"x{i}")
        ps.append(b.add_node("reshape", [x], {"shape": a.shape}, node_id=f"p{i}"))
    if case.op == "input":
        b.add_node("input", [], {"tensor": "y", "shape": (7, 5), "dtype": "float64"}, node_id="y")
    elif case.op == "fused" and "reduce" in case.attrs:  # reduce(exp(p0 * 2 + 1) * p1)
        body = b.op("exp", ps[0] * 2.0 + 1.0)
        body = b.op("mul", body, ps[1]) if len(ps) > 1 else body
        attrs = {k: v for k, v in case.attrs.items() if k != "reduce"}
        b.add_node(case.attrs["reduce"], [body], attrs, node_id="y")
    elif case.op == "fused":  # exp(p0 * 2 + 1) - p0, fused into one node that keeps the id y
        p = ps[0]
        b.add_node("sub", [b.op("exp", p * 2.0 + 1.0), p], {}, node_id="y")
    else:
        b.add_node(case.op, ps, case.attrs, node_id="y")
    g = validate(b.graph(["y"]))
    if case.op == "fused":
        g = fuse_elementwise(g)
        assert g["y"].op == "fused"
    return g


def _axes(g: Graph, nid: str) -> tuple[Any, ...]:
    node = g[nid]
    space = space_of(node, [g.type_of(i) for i in node.inputs], optable.get(node.op).split)
    return space.axes if space is not None else ()


def _configs(g: Graph) -> dict[str, TileSizes]:
    axes = _axes(g, "y")
    thirds = {"y": {a.name: max(1, math.ceil(a.length / 3)) for a in axes}}
    halves = {p: {a.name: max(1, math.ceil(a.length / 2)) for a in _axes(g, p)}
              for p in g.nodes if p.startswith("p")}
    misaligned = {**halves, "y": {a.name: a.length // 3 + 1 for a in axes}}
    return {"auto": TileSizes(min_tasks=6, executors=6, ratio=0.0), "thirds": TileSizes(explicit=thirds),
            "misaligned": TileSizes(explicit=misaligned)}


def _bindings(arrays: list[np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {f"x{i}": a for i, a in enumerate(arrays)}
    out["y"] = rng.normal(size=(7, 5))  # the 'input' case's own data
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_split_equals_unsplit(case: Case, rng: np.random.Generator, seed: int, run: Any) -> None:
    arrays = case.make(rng)
    g = _graph(case, arrays)
    bindings = _bindings(arrays, rng)
    want = run(g, bindings)["y"]
    exact = optable.get(case.op).split.kind in EXACT_KINDS  # type: ignore[union-attr]
    for name, sizes in _configs(g).items():
        tiled = tile_graph(g, sizes)
        got = tiled.assemble("y", run(tiled.graph, bindings))
        what = f"{case.id} tiled {name} (seed {seed}): grid {tiled.grids['y'].counts}"
        tasks = [t for t, o in tiled.origin.items()
                 if o == "y" and tiled.roles[t] in ("tile", "partial", "source")]
        assert len(tasks) > 1, f"{what}: y was not split"
        assert got.dtype == want.dtype, what
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=what)
        else:
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def test_every_op_with_a_split_rule_has_a_case() -> None:
    with_rule = {name for name, op in optable.table().items() if op.split is not None}
    assert with_rule - {c.op for c in CASES} == set()


def test_every_declared_kind_has_a_rule() -> None:
    from triplane.scheduler.compiler.tiling.rules import RULES

    kinds = {op.split.kind for op in optable.table().values() if op.split is not None}
    assert kinds - set(RULES) == set()


def test_k_split_matmul_makes_partials_and_an_add_tree(rng: np.random.Generator, seed: int, run: Any) -> None:
    arrays = _ff((6, 10), (10, 5))(rng)
    g = _graph(Case("matmul", lambda r: arrays), arrays)
    tiled = tile_graph(g, TileSizes(explicit={"y": {"k": 3}}))  # K = 10 -> 3, 3, 3, 1
    roles = [tiled.roles[t] for t, o in tiled.origin.items() if o == "y"]
    assert roles.count("partial") == 4 and roles.count("combine") == 3, roles
    got = tiled.assemble("y", run(tiled.graph, _bindings(arrays, rng)))
    np.testing.assert_allclose(got, arrays[0] @ arrays[1], rtol=RTOL, atol=ATOL, err_msg=f"seed {seed}")


def test_ops_without_a_rule_run_whole_on_regrouped_inputs(rng: np.random.Generator, run: Any) -> None:
    b = Builder()
    x = b.add_node("input", [], {"tensor": "x", "shape": (6, 4), "dtype": "float64"}, node_id="x")
    p = b.add_node("neg", [x], {}, node_id="p")
    b.add_node("unslice", [p], {"shape": (8, 4), "starts": (1, 0), "stops": (7, 4), "steps": (1, 1)},
               node_id="y")
    g = validate(b.graph(["y"]))
    tiled = tile_graph(g, TileSizes(explicit={"p": {"d0": 2}}))
    assert tiled.grids["y"].counts == (1, 1)
    assert [n.op for n in tiled.graph.nodes.values()].count("concat") == 1  # p's 3 tiles joined once
    data = rng.normal(size=(6, 4))
    want = run(g, {"x": data})["y"]
    np.testing.assert_array_equal(tiled.assemble("y", run(tiled.graph, {"x": data})), want)
