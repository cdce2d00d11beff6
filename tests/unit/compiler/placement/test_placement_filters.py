"""Filter, score and bind extension points: coded statuses whose reasons name the op,
the dtype, the tensor and the limit."""

from __future__ import annotations

import pytest

from triplane.proto.builder import Builder
from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import CostModel, NodeFigures
from triplane.scheduler.compiler.placement import (
    Binder,
    Code,
    Estimate,
    Framework,
    PlacementError,
    PlacementState,
    Status,
    SupportsOp,
    TaskView,
    place,
    task_views,
)

MiB = 2**20


def fig(name: str, mem: int = 768 * MiB, **kw: object) -> NodeFigures:
    return NodeFigures(name, gflops=10.0, gbps=5.0, memory_capacity=mem, **kw)  # type: ignore[arg-type]


def conv_graph(dtype: str) -> tuple[Graph, str]:
    b = Builder()
    x = b.op("input", tensor="x", shape=(2, 3, 8, 8), dtype=dtype)
    w = b.op("input", tensor="w", shape=(4, 3, 3, 3), dtype=dtype)
    y = b.op("conv2d", x, w)
    return b.graph([y]), y.id


def test_no_engine_for_the_op_names_the_op() -> None:
    g, y = conv_graph("float32")
    nodes = [fig("n0", ops=frozenset({"matmul"})), fig("n1", ops=frozenset({"add"}))]
    with pytest.raises(PlacementError) as e:
        place(g, nodes)
    assert e.value.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "no engine supports conv2d" in str(e.value)
    assert e.value.node == y and e.value.op == "conv2d"
    assert isinstance(e.value, GraphError)  # the API answers 4xx for it, as for a bad graph


def test_no_engine_for_the_dtype_names_op_and_dtype() -> None:
    g, _ = conv_graph("bfloat16")
    nodes = [fig("n0", ops=frozenset({"conv2d"}), dtypes=frozenset({"float32"})),
             fig("n1", ops=frozenset({"matmul"}), dtypes=frozenset({"bfloat16"}))]
    with pytest.raises(PlacementError, match="no engine supports conv2d on bfloat16"):
        place(g, nodes)
    # one node with both is enough, and it is the one chosen
    ok = place(g, [*nodes, fig("n2", ops=frozenset({"conv2d"}), dtypes=frozenset({"bfloat16"}))])
    assert {tp.node for tp in ok.tasks.values()} == {"n2"}


def test_per_node_filter_status_says_why() -> None:
    g, y = conv_graph("bfloat16")
    state = PlacementState(g, [fig("n0")], CostModel(), {})
    view = task_views(g)[y]
    st = SupportsOp().filter(view, fig("n0", ops=frozenset({"conv2d"}), dtypes=frozenset({"float32"})),
                             None, state)
    assert st.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE and st.plugin == "SupportsOp"
    assert "bfloat16" in st.reason and "n0" in st.reason
    assert SupportsOp().filter(view, fig("n0"), None, state).ok


def test_a_fused_task_needs_every_op_of_its_program() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(16,), dtype="float32")
    f = b.op("fused", x, program=[["exp", [0], {}], ["tanh", [1], {}]])
    g = b.graph([f])
    nodes = [fig("n0", ops=frozenset({"fused", "exp"}))]
    with pytest.raises(PlacementError, match="no engine supports tanh"):
        place(g, nodes)
    assert place(g, [fig("n0", ops=frozenset({"fused", "exp", "tanh"}))]).makespan > 0


def test_a_task_larger_than_any_node_names_tensor_and_limit() -> None:
    b = Builder()
    big = b.op("uniform", shape=(15 * 2**10, 2**14), seed=3)  # 960 MiB of float32
    g = b.graph([big])
    nodes = [fig("n0", 512 * MiB), fig("n1", 256 * MiB), fig("n2", 768 * MiB)]
    with pytest.raises(PlacementError) as e:
        place(g, nodes)
    msg = str(e.value)
    assert e.value.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "needs 960 MiB" in msg and "the largest free memory is 768 MiB on n2" in msg
    assert big.id in msg and "uniform" in msg


def test_memory_held_by_live_outputs_makes_a_task_unschedulable() -> None:
    b = Builder()
    a = b.op("full", value=1.0, shape=(3 * 2**16,))  # 0.75 MiB, kept: it is an output
    c = b.op("full", value=2.0, shape=(3 * 2**16,))
    g = b.graph([a, c])
    with pytest.raises(PlacementError) as e:
        place(g, [fig("n0", MiB)])
    assert e.value.status.code is Code.UNSCHEDULABLE  # not a limit of the node, of what it holds
    assert "holds 768 KiB of 1 MiB" in str(e.value)
    two = place(g, [fig("n0", MiB), fig("n1", MiB)])  # a second node resolves it
    assert two.node_of(a.id) != two.node_of(c.id)
    assert all(v <= MiB for v in two.peak_memory.values())


class _Forbid:
    name = "Forbid"

    def __init__(self, node: str) -> None:
        self.node = node

    def filter(self, task: TaskView, node: NodeFigures, est: Estimate | None,
               state: PlacementState) -> Status:
        if node.name == self.node:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, f"{node.name} is cordoned", self.name)
        return Status()

    def summarize(self, task: TaskView, failed: object, state: PlacementState) -> str:
        return "every node is cordoned"


class _Boom(_Forbid):
    name = "Boom"

    def filter(self, task: TaskView, node: NodeFigures, est: Estimate | None,
               state: PlacementState) -> Status:
        raise RuntimeError("disk on fire")


def _independent(n: int) -> Graph:
    b = Builder()
    return b.graph([b.op("uniform", shape=(64, 64), seed=i) for i in range(n)])


def test_a_custom_filter_is_an_extension_point() -> None:
    fw = Framework()
    fw.filters.append(_Forbid("n0"))
    p = place(_independent(4), [fig("n0"), fig("n1")], framework=fw)
    assert {tp.node for tp in p.tasks.values()} == {"n1"}
    fw.filters.append(_Forbid("n1"))
    with pytest.raises(PlacementError, match="every node is cordoned"):
        place(_independent(1), [fig("n0"), fig("n1")], framework=fw)


def test_a_plugin_that_raises_is_an_error_status_naming_it() -> None:
    fw = Framework()
    fw.filters.append(_Boom("n0"))
    with pytest.raises(PlacementError) as e:
        place(_independent(1), [fig("n0")], framework=fw)
    assert e.value.status.code is Code.ERROR and e.value.status.plugin == "Boom"
    assert "disk on fire" in str(e.value)


class _Recorder:
    name = "Recorder"

    def __init__(self, answer: Status) -> None:
        self.answer, self.seen = answer, []

    def bind(self, task: TaskView, est: Estimate, state: PlacementState) -> Status:
        self.seen.append((task.id, est.node))
        return self.answer


def test_binders_run_in_order_until_one_does_not_skip() -> None:
    skip = _Recorder(Status(Code.SKIP))
    fw = Framework(binders=[skip, Binder()])
    p = place(_independent(3), [fig("n0"), fig("n1")], framework=fw)
    assert sorted(t for t, _ in skip.seen) == sorted(p.tasks)
    assert all(p.node_of(t) == n for t, n in skip.seen)
    veto = _Recorder(Status(Code.ERROR, "quota exceeded", "Recorder"))
    with pytest.raises(PlacementError, match="quota exceeded"):
        place(_independent(1), [fig("n0")], framework=Framework(binders=[veto, Binder()]))


def test_unknown_input_location_and_empty_cluster_are_value_errors() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(4,), dtype="float32")
    g = b.graph([b.op("exp", x)])
    with pytest.raises(ValueError, match="not a node"):
        place(g, [fig("n0")], locations={x.id: "mars"})
    with pytest.raises(ValueError, match="no nodes"):
        place(g, [])
