"""Per-pair network figures: the cost model prices a transfer with the pair's figures (else
the nodes' own), and placement keeps work off a node whose links are slow."""

from __future__ import annotations

import pytest

from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.registry import LinkInfo, NetworkEngineInfo, OpEngineInfo
from triplane.scheduler.cluster import figures_from_records
from triplane.scheduler.compiler.costmodel import CostModel, NodeFigures
from triplane.scheduler.compiler.layout import figures_from_json, figures_to_json
from triplane.scheduler.compiler.placement import place

EXACT = CostModel(task_overhead_s=0.0, op_scale={})
SLOW = (0.001, 30_000.0)  # 1 MB/s and 30 ms: the slowed peer's links


def fig(name: str, links: tuple[tuple[str, float, float], ...] = ()) -> NodeFigures:
    return NodeFigures(name, gflops=1.0, gbps=1.0, memory_capacity=2**31, bandwidth_gbps=1.0,
                       latency_us=0.0, links=links)


def sum_of_uniforms(n: int = 6) -> Graph:
    b = Builder()
    us = [b.op("uniform", shape=(500, 500), seed=i) for i in range(n)]
    acc = us[0]
    for u in us[1:]:
        acc = b.op("add", acc, u)
    return b.graph([acc])


def test_a_transfer_uses_the_pair_and_falls_back_to_the_nodes() -> None:
    a, b, c = fig("a", (("b", 0.5, 200.0),)), fig("b"), fig("c")
    assert EXACT.transfer_time(1e9, a, b) == pytest.approx(1e9 / 0.5e9 + 200e-6)
    assert EXACT.transfer_time(1e9, b, a) == pytest.approx(2.0 + 200e-6)  # measured the other way
    assert EXACT.transfer_time(1e9, a, c) == pytest.approx(1.0)  # unmeasured: the nodes' figures
    both = fig("b", (("a", 0.25, 100.0),))
    assert EXACT.transfer_time(1e9, a, both) == pytest.approx(4.0 + 200e-6)  # the worse of both


def test_placement_avoids_a_peer_whose_links_are_slow() -> None:
    g = sum_of_uniforms()
    alike = place(g, [fig("a"), fig("b"), fig("slow")], model=EXACT)
    assert alike.by_node().get("slow"), "control: with no pair figures the third node gets work"
    measured = [fig("a", (("b", 1.0, 0.0), ("slow", *SLOW))), fig("b", (("a", 1.0, 0.0), ("slow", *SLOW))),
                fig("slow", (("a", *SLOW), ("b", *SLOW)))]
    p = place(g, measured, model=EXACT)
    assert not p.by_node().get("slow")
    assert p.makespan < 0.1  # what putting any producer there would cost: 1 MB at 1 MB/s


def test_pairs_alike_change_nothing() -> None:
    g = sum_of_uniforms()
    plain = place(g, [fig("a"), fig("b"), fig("c")], model=EXACT)
    names = ("a", "b", "c")
    links = {n: tuple((m, 1.0, 0.0) for m in names if m != n) for n in names}
    same = place(g, [fig(n, links[n]) for n in names], model=EXACT)
    assert {t: tp.node for t, tp in same.tasks.items()} == {t: tp.node for t, tp in plain.tasks.items()}
    assert same.makespan == pytest.approx(plain.makespan)


def test_the_registry_pairs_reach_the_figures_and_their_record() -> None:
    ops = [OpEngineInfo(n, "numpy", "numpy", "cpu", ("add",), ("float32",), 10.0, 5.0) for n in ("a", "b")]
    nets = [NetworkEngineInfo(n, "tcp", "tcp", 2.0, 50.0, 9000) for n in ("a", "b")]
    links = [LinkInfo("a", "b", "tcp", 0.5, 300.0, 1.0), LinkInfo("a", "gone", "tcp", 9.0, 1.0, 1.0)]
    figs = {f.name: f for f in figures_from_records(ops, [], nets, links)}
    assert figs["a"].links == (("b", 0.5, 300.0),) and figs["a"].link("gone") is None
    assert figs["b"].links == () and figs["b"].bandwidth_gbps == 2.0
    again = figures_from_json(figures_to_json(list(figs.values())))
    assert again[0].links == (("b", 0.5, 300.0),)
    old = [{k: v for k, v in d.items() if k != "links"} for d in figures_to_json(list(figs.values()))]
    assert figures_from_json(old)[0].links == ()  # a record written before pairs existed
