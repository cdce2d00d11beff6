"""List scheduling: balance, locality against compute, hand-computed makespans, memory
liveness, and the invariants of any schedule on random task graphs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import CostModel, NodeFigures
from triplane.scheduler.compiler.memory import plan_memory
from triplane.scheduler.compiler.placement import Code, Framework, Placement, PlacementError, place

EXACT = CostModel(task_overhead_s=0.0, op_scale={})  # the bare roofline, no calibration
REL = 1e-9  # the schedule is arithmetic on predictions: only float rounding differs


def fig(name: str, *, gflops: float = 1.0, gbps: float = 1.0, bw: float = 1.0, lat: float = 0.0,
        mem: int = 2**30, slots: int = 1) -> NodeFigures:
    return NodeFigures(name, gflops=gflops, gbps=gbps, memory_capacity=mem, bandwidth_gbps=bw,
                       latency_us=lat, slots=slots)


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


def test_independent_tasks_balance_over_nodes() -> None:
    b = Builder()
    g = b.graph([b.op("uniform", shape=(100, 100), seed=i) for i in range(9)])
    p = place(g, [fig("n0"), fig("n1"), fig("n2")], model=EXACT)
    counts = {n: len(ts) for n, ts in p.by_node().items()}
    assert counts == {"n0": 3, "n1": 3, "n2": 3}
    one = 20 * 100 * 100 / 1e9  # uniform: 20 flops an element at 1 GFLOP/s
    assert p.makespan == pytest.approx(3 * one, rel=REL)


def test_slots_run_tasks_side_by_side() -> None:
    b = Builder()
    g = b.graph([b.op("uniform", shape=(100, 100), seed=i) for i in range(4)])
    p = place(g, [fig("n0", slots=4)], model=EXACT)
    assert p.makespan == pytest.approx(20 * 100 * 100 / 1e9, rel=REL)


def hand_graph() -> tuple[Graph, dict[str, str]]:
    b = Builder()
    u1 = b.op("uniform", shape=(100, 100), seed=1)
    u2 = b.op("uniform", shape=(100, 100), seed=2)
    m1 = b.op("matmul", u1, u1)
    m2 = b.op("matmul", u2, u2)
    s = b.op("add", m1, m2)
    return b.graph([s]), {"u1": u1.id, "u2": u2.id, "m1": m1.id, "m2": m2.id, "s": s.id}


def test_makespan_matches_a_hand_computation() -> None:
    # 1 GFLOP/s, 1 GB/s, 1 GB/s links, no latency or overhead:
    #   uniform 100x100: 20 flops x 1e4 = 2e5 flops -> 0.2 ms
    #   matmul 100x100x100: 2e6 flops -> 2 ms (its 120 kB move in 0.12 ms: compute bound)
    #   add: 1e4 flops, 120 kB -> 0.12 ms (memory bound)
    #   a 100x100 float32 tile over the wire: 40 kB -> 0.04 ms
    g, ids = hand_graph()
    one = place(g, [fig("n0")], model=EXACT)
    assert one.makespan == pytest.approx(0.2e-3 + 0.2e-3 + 2e-3 + 2e-3 + 0.12e-3, rel=REL)
    assert all(tp.comm_s == 0 for tp in one.tasks.values())
    two = place(g, [fig("n0"), fig("n1")], model=EXACT)
    # both branches run side by side; the add pulls the other branch's product
    assert two.makespan == pytest.approx(0.2e-3 + 2e-3 + 0.04e-3 + 0.12e-3, rel=REL)
    where = {k: two.node_of(v) for k, v in ids.items()}
    assert where["u1"] == where["m1"] != where["m2"] == where["u2"]
    s = two.tasks[ids["s"]]
    assert s.comm_s == pytest.approx(0.04e-3, rel=REL) and len(s.pulls) == 1
    assert s.start == pytest.approx(2.24e-3, rel=REL)


def test_overhead_adds_once_per_task() -> None:
    g, _ = hand_graph()
    base = place(g, [fig("n0")], model=EXACT).makespan
    slow = CostModel(task_overhead_s=1e-3, op_scale={})
    assert place(g, [fig("n0")], model=slow).makespan == pytest.approx(base + 5e-3)


def chain(n: int) -> tuple[Graph, str, list[str]]:
    b = Builder()
    x = b.op("input", tensor="x", shape=(100, 100), dtype="float32")
    y, ids = x, []
    for _ in range(n):
        y = b.op("matmul", y, x)
        ids.append(y.id)
    return b.graph([y]), x.id, ids


def test_a_chain_stays_where_its_data_is_when_transfers_are_expensive() -> None:
    g, x, ids = chain(4)
    slow, fast = fig("slow", gflops=1.0, bw=1e-5), fig("fast", gflops=10.0, bw=1e-5)
    p = place(g, [slow, fast], model=EXACT, locations={x: "slow"})
    assert {p.node_of(t) for t in ids} == {"slow"}
    assert p.makespan == pytest.approx(4 * 2e-3, rel=REL)


def test_a_chain_moves_to_the_fast_node_when_compute_dominates() -> None:
    g, x, ids = chain(4)
    slow, fast = fig("slow", gflops=1.0, bw=10.0), fig("fast", gflops=10.0, bw=10.0)
    p = place(g, [slow, fast], model=EXACT, locations={x: "slow"})
    assert {p.node_of(t) for t in ids} == {"fast"}
    # one pull of x (40 kB at 10 GB/s), then 4 matmuls at 10 GFLOP/s
    assert p.makespan == pytest.approx(4e-6 + 4 * 0.2e-3, rel=REL)


def fan_out(k: int) -> tuple[Graph, str, list[str]]:
    b = Builder()
    x = b.op("input", tensor="x", shape=(100, 100), dtype="float32")
    outs = [b.op("matmul", x, b.op("transpose", x, perm=[1, 0]) if i % 2 else x) for i in range(k)]
    return b.graph(outs), x.id, [o.id for o in outs]


def test_fan_out_stays_local_with_expensive_transfers_and_spreads_when_compute_dominates() -> None:
    g, x, ids = fan_out(6)
    nodes = [fig(f"n{i}", bw=1e-5) for i in range(3)]
    stay = place(g, nodes, model=EXACT, locations={x: "n0"})
    assert {stay.node_of(t) for t in ids} == {"n0"}
    nodes = [fig(f"n{i}", bw=10.0) for i in range(3)]
    spread = place(g, nodes, model=EXACT, locations={x: "n0"})
    per_node = {n: sum(1 for t in ids if spread.node_of(t) == n) for n in ("n0", "n1", "n2")}
    assert per_node == {"n0": 2, "n1": 2, "n2": 2}
    assert spread.makespan < stay.makespan / 2


def test_peak_memory_of_a_chain_on_one_node_equals_the_memory_plan() -> None:
    b = Builder()
    y = b.op("full", value=1.0, shape=(256, 1024))  # 1 MiB
    for k in range(8):
        y = b.op("exp" if k % 2 else "neg", y)
    g = b.graph([y])
    p = place(g, [fig("n0")], model=EXACT)
    assert p.peak_memory["n0"] == plan_memory(g).peak_bytes == 2 * 2**20


def branches(k: int) -> Graph:
    b = Builder()
    outs = []
    for i in range(k):
        t = b.op("uniform", shape=(256, 1024), seed=i)  # 1 MiB each, freed after its exp
        outs.append(b.op("sum", b.op("exp", t)))
    return b.graph(outs)


def test_memory_pressure_finishes_branches_before_starting_new_ones() -> None:
    g = branches(4)
    mem = 3 * 2**20 + 64  # three branch tensors at once, and the tiny sums
    p = place(g, [fig("n0", mem=mem)], model=EXACT)
    assert p.peak_memory["n0"] <= mem
    # rank order alone starts every branch first and then has no room to finish any
    with pytest.raises(PlacementError) as e:
        place(g, [fig("n0", mem=mem)], model=EXACT, framework=Framework(pressure=1.0))
    assert e.value.status.code is Code.UNSCHEDULABLE
    roomy = place(g, [fig("n0")], model=EXACT)  # without pressure, rank order: all sources first
    assert roomy.peak_memory["n0"] == 5 * 2**20
    assert roomy.makespan == pytest.approx(p.makespan, rel=REL)  # one node: same work, same time


def assert_valid(g: Graph, p: Placement, nodes: list[NodeFigures], model: CostModel, msg: str) -> None:
    """Invariants every schedule must keep."""
    figs = {n.name: n for n in nodes}
    for tid, tp in p.tasks.items():
        node = g.nodes[tid]
        assert tp.finish == pytest.approx(tp.start + tp.compute_s, rel=REL), msg
        for i in set(node.inputs):
            if i in p.tasks:
                src = p.tasks[i]
                # a pulled input arrives at the earliest one transfer after its producer finished
                lag = 0.0 if src.node == tp.node else model.transfer_time(
                    g.nodes[i].type.nbytes, figs[src.node], figs[tp.node])
                assert tp.start >= src.finish + lag * (1 - 1e-9) - 1e-12, f"{msg}: {tid} before {i}"
    for name, placed in p.by_node().items():
        runs = sorted((tp.start, tp.finish) for tp in placed)
        for (_, f0), (s1, _) in itertools.pairwise(runs):
            assert s1 >= f0 - 1e-12, f"{msg}: tasks overlap on {name}"
        assert p.peak_memory[name] <= figs[name].free, f"{msg}: {name} over its memory"
    assert p.makespan == max(tp.finish for tp in p.tasks.values())
    assert set(p.tasks) == {k for k, n in g.nodes.items() if n.op != "input"}


def random_dag(rng: np.random.Generator, n: int) -> Graph:
    b = Builder()
    refs = [b.op("input", tensor="x", shape=(64, 64), dtype="float32")]
    for i in range(n):
        kind = rng.integers(0, 4)
        if kind == 0:
            refs.append(b.op("uniform", shape=(64, 64), seed=int(i)))
        else:
            a = refs[int(rng.integers(0, len(refs)))]
            c = refs[int(rng.integers(0, len(refs)))]
            refs.append(b.op(("matmul", "add", "mul")[kind - 1], a, c))
    return b.graph([refs[-1], refs[len(refs) // 2]])


def test_random_graphs_give_valid_schedules(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(20):
        g = random_dag(rng, int(rng.integers(5, 40)))
        total = sum(n.type.nbytes for n in g.nodes.values())  # enough: a node holds each at most once
        nodes = [fig(f"n{k}", gflops=float(rng.uniform(1, 20)), gbps=float(rng.uniform(1, 10)),
                     bw=float(rng.uniform(0.01, 5)), lat=float(rng.uniform(0, 100)),
                     mem=total + int(rng.integers(0, total)))
                 for k in range(int(rng.integers(1, 5)))]
        model = CostModel(task_overhead_s=float(rng.uniform(0, 1e-4)))
        p = place(g, nodes, model=model)
        assert_valid(g, p, nodes, model, f"seed {seed}, trial {trial}")


def test_random_graphs_in_tight_memory_fit_or_say_why(seed: int) -> None:
    rng = np.random.default_rng(seed)
    placed = 0
    for trial in range(30):
        g = random_dag(rng, int(rng.integers(5, 40)))
        tile = 64 * 64 * 4
        nodes = [fig(f"n{k}", mem=int(rng.integers(3, 12)) * tile, bw=float(rng.uniform(0.1, 5)))
                 for k in range(int(rng.integers(1, 4)))]
        try:
            p = place(g, nodes, model=EXACT)
        except PlacementError as e:
            assert e.status.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE), e
            assert "needs" in str(e) and e.node in g.nodes, f"seed {seed}, trial {trial}: {e}"
            continue
        placed += 1
        assert_valid(g, p, nodes, EXACT, f"seed {seed}, trial {trial}")
    assert placed >= 10, f"seed {seed}: only {placed} of 30 placed"


def test_more_nodes_never_predicts_slower_for_independent_work(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = Builder()
    g = b.graph([b.op("uniform", shape=(int(rng.integers(10, 200)), 64), seed=i) for i in range(12)])
    spans = [place(g, [fig(f"n{k}") for k in range(n)], model=EXACT).makespan for n in (1, 2, 3, 4)]
    assert all(a >= b_ * (1 - 1e-12) for a, b_ in itertools.pairwise(spans)), f"seed {seed}: {spans}"
    assert spans[-1] < spans[0] / 2, f"seed {seed}: {spans}"


def test_a_large_tile_graph_places_quickly() -> None:
    # the shape a tiled 12288^2 matmul takes: 6x6 output tiles of 2048^2, K split in 6
    import time

    b = Builder()
    n, t = 6, 2048
    a = [[b.op("uniform", shape=(t, t), seed=i * n + j) for j in range(n)] for i in range(n)]
    w = [[b.op("normal", shape=(t, t), seed=100 + i * n + j) for j in range(n)] for i in range(n)]
    outs = []
    for i in range(n):
        for j in range(n):
            acc = b.op("matmul", a[i][0], w[0][j])
            for k in range(1, n):
                acc = b.op("add", acc, b.op("matmul", a[i][k], w[k][j]))
            outs.append(acc)
    g = b.graph(outs)
    nodes = [fig(f"n{k}", gflops=50.0, gbps=10.0, bw=1.0, lat=100.0, mem=768 * 2**20) for k in range(3)]
    t0 = time.perf_counter()
    p = place(g, nodes)
    elapsed = time.perf_counter() - t0
    assert len(p.tasks) == 72 + 36 * 11
    assert elapsed < 5.0, f"placing {len(p.tasks)} tasks took {elapsed:.1f} s"
    assert all(v <= 768 * 2**20 for v in p.peak_memory.values())
    assert all(len(ts) > 100 for ts in p.by_node().values())  # every node works
