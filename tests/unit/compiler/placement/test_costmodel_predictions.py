"""The cost model: predictions follow the op table's work and the nodes' figures."""

from __future__ import annotations

import numpy as np
import pytest

from triplane.proto.builder import Builder
from triplane.registry.records import MemoryEngineInfo, NetworkEngineInfo, OpEngineInfo
from triplane.scheduler.cluster import figures_from_records
from triplane.scheduler.compiler.costmodel import (
    CostModel,
    NodeFigures,
    TaskCost,
    parse_bytes,
    parse_rate,
    task_cost,
)
from triplane.scheduler.compiler.placement import place

REL = 1e-12  # predictions are closed-form arithmetic: only rounding differs


def node(name: str = "n0", **kw: float) -> NodeFigures:
    args = {"gflops": 10.0, "gbps": 5.0, "memory_capacity": 2**30, "bandwidth_gbps": 1.0, "latency_us": 50.0}
    args.update(kw)
    return NodeFigures(name, **args)  # type: ignore[arg-type]


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def test_double_the_flops_doubles_the_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    model = CostModel(task_overhead_s=0.0)
    n = node(gflops=float(rng.uniform(1, 100)), gbps=float(rng.uniform(1, 100)))
    flops = float(rng.uniform(1e9, 1e11))
    small = TaskCost(flops, 1.0, 4)  # compute bound: bytes negligible
    big = TaskCost(2 * flops, 1.0, 4)
    t1, t2 = model.compute_time(small, n), model.compute_time(big, n)
    assert t1 == pytest.approx(flops / (n.gflops * 1e9), rel=REL), f"seed {seed}"
    assert t2 == pytest.approx(2 * t1, rel=REL), f"seed {seed}"


def test_memory_bound_time_follows_bytes_and_overhead_is_added(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = node(gflops=100.0, gbps=float(rng.uniform(1, 20)))
    nbytes = float(rng.uniform(1e8, 1e9))
    model = CostModel(task_overhead_s=1e-4)
    t = model.compute_time(TaskCost(1.0, nbytes, 0), n)
    assert t == pytest.approx(nbytes / (n.gbps * 1e9) + 1e-4, rel=REL), f"seed {seed}"
    doubled = model.compute_time(TaskCost(1.0, 2 * nbytes, 0), n)
    assert doubled - 1e-4 == pytest.approx(2 * (t - 1e-4), rel=1e-9)
    scaled = CostModel(task_overhead_s=1e-4, op_scale={"normal": 3.0})
    assert scaled.compute_time(TaskCost(1.0, nbytes, 0), n, "normal") == pytest.approx(3 * (t - 1e-4) + 1e-4)


def test_matmul_cost_comes_from_the_op_table(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m, k, n_ = (int(x) for x in rng.integers(2, 300, 3))
    b = Builder()
    x = b.op("uniform", shape=(m, k), seed=1)
    y = b.op("uniform", shape=(k, n_), seed=2)
    z = b.op("matmul", x, y)
    g = b.graph([z])
    c = task_cost(g, z.id)
    assert c.flops == 2.0 * m * n_ * k, f"seed {seed}: {m}x{k}x{n_}"
    assert c.bytes == 4.0 * (m * k + k * n_ + m * n_)
    assert c.out_bytes == 4 * m * n_


def test_transfer_time_is_zero_when_local_and_bytes_over_the_slower_link_otherwise() -> None:
    model = CostModel()
    a, b = node("a", bandwidth_gbps=2.0, latency_us=10.0), node("b", bandwidth_gbps=0.5, latency_us=40.0)
    assert model.transfer_time(10**9, a, a) == 0.0
    assert model.transfer_time(10**9, a, b) == pytest.approx(10**9 / 0.5e9 + 40e-6, rel=REL)
    assert model.transfer_time(2 * 10**9, a, b) - 40e-6 == pytest.approx(2 * (10**9 / 0.5e9), rel=REL)
    # from the scheduler's data server: the destination's link decides
    assert model.transfer_time(10**9, None, a) == pytest.approx(0.5 + 10e-6, rel=REL)


def test_data_already_local_costs_no_communication() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(256, 256), dtype="float32")
    y = b.op("exp", x)
    g = b.graph([y])
    nodes = [node("n0"), node("n1")]
    local = place(g, nodes, locations={x.id: "n1"})
    assert local.tasks[y.id].node == "n1"
    assert local.tasks[y.id].comm_s == 0.0 and local.tasks[y.id].pulls == ()
    remote = place(g, nodes)  # x is on the scheduler: pulled by whichever node runs exp
    expected = 256 * 256 * 4 / 1e9 + 50e-6
    assert remote.tasks[y.id].comm_s == pytest.approx(expected, rel=REL)
    assert remote.tasks[y.id].pulls[0].source == "scheduler"


def test_figures_from_records_aggregate_a_node_engines() -> None:
    ops = [OpEngineInfo("n1", "numpy", "numpy", "cpu", ("matmul", "add"), ("float32",), 40.0, 8.0),
           OpEngineInfo("n1", "vendor", "npu", "npu0", ("conv2d",), ("bfloat16",), 400.0, 80.0),
           OpEngineInfo("n0", "numpy", "numpy", "cpu", ("add",), ("float32",), 20.0, 4.0)]
    mems = [MemoryEngineInfo("n1", "host", "host", 1000, 600),
            MemoryEngineInfo("n1", "dev", "device", 500, 500),
            MemoryEngineInfo("n0", "host", "host", 300, 100),
            MemoryEngineInfo("gone", "host", "host", 1, 1)]
    nets = [NetworkEngineInfo("n1", "tcp", "tcp", 1.25, 80.0),
            NetworkEngineInfo("n1", "rdma", "rdma", 12.5, 5.0)]
    figs = figures_from_records(ops, mems, nets, default_bandwidth_gbps=0.3, default_latency_us=123.0)
    assert [f.name for f in figs] == ["n0", "n1"]  # "gone" has no op engine: not a compute node
    n0, n1 = figs
    assert n1.ops == {"matmul", "add", "conv2d"} and n1.dtypes == {"float32", "bfloat16"}
    assert (n1.gflops, n1.gbps, n1.slots) == (400.0, 80.0, 2)
    assert (n1.memory_capacity, n1.free) == (1500, 1100)
    assert (n1.bandwidth_gbps, n1.latency_us) == (12.5, 5.0)
    assert (n0.bandwidth_gbps, n0.latency_us, n0.free) == (0.3, 123.0, 100)


def test_node_figures_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="gflops"):
        node(gflops=0.0)
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        node(bandwidth_gbps=float("nan"))


@pytest.mark.parametrize(("text", "value"), [("768MiB", 768 * 2**20), ("1GB", 10**9), ("2 GiB", 2 * 2**30),
                                             ("1048576", 2**20), ("1.5k", 1500)])
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize(("text", "value"),
                         [("1GB/s", 1.0), ("100MB/s", 0.1), ("10Gbit/s", 1.25), ("2", 2.0)])
def test_parse_rate(text: str, value: float) -> None:
    assert parse_rate(text) == pytest.approx(value)


def test_parse_bytes_names_the_units_it_knows() -> None:
    with pytest.raises(ValueError, match="MiB"):
        parse_bytes("12 parsecs")


def test_a_view_op_costs_the_overhead_and_the_engine_runs_it_as_a_view(seed: int) -> None:
    from triplane.engines.op.numpy_engine import NumpyEngine
    from triplane.scheduler.compiler.costmodel import INLINE_OPS

    # the model prices as free what the table declares a view and the engine runs inline
    assert {"slice", "transpose", "broadcast_to"} == INLINE_OPS
    x = np.ones((4, 4), np.float32)
    assert all(NumpyEngine().cheap(op, [x]) for op in INLINE_OPS)
    m, n = CostModel(), node()
    big = TaskCost(flops=1e12, bytes=1e12, out_bytes=1 << 20)
    for op in sorted(INLINE_OPS):
        assert m.compute_time(big, n, op) == m.task_overhead_s
    assert m.compute_time(big, n, "exp") == pytest.approx(1e12 / 5e9 + m.task_overhead_s, rel=REL)


def test_a_view_op_starts_when_its_input_is_ready_beside_a_running_kernel() -> None:
    b = Builder()
    x = b.op("input", tensor="x", shape=(512, 512), dtype="float32")
    w = b.op("input", tensor="w", shape=(512, 512), dtype="float32")
    e = b.op("exp", x)
    long = b.op("matmul", e, w)  # ~27 ms on 10 GFLOP/s, placed before the transpose
    t = b.op("transpose", e, perm=[1, 0])
    s = b.op("neg", t)
    g = b.graph([long, s])
    p = place(g, [node("n0")], locations={x.id: "n0", w.id: "n0"})
    tasks = p.tasks
    assert tasks[t.id].start == pytest.approx(tasks[e.id].finish, rel=REL)  # not after the matmul
    assert tasks[t.id].finish - tasks[t.id].start == pytest.approx(CostModel().task_overhead_s, rel=REL)
    # It holds no slot: the matmul and the neg still run one after the other, in full.
    a, c = sorted((tasks[long.id], tasks[s.id]), key=lambda tp: tp.start)
    assert c.start >= a.finish - 1e-12 and a.start >= tasks[e.id].finish - 1e-12
