"""The scheduler's knowledge of cached upload tiles, and a job placed where they are (pure)."""

from __future__ import annotations

from triplane.proto.builder import Builder
from triplane.proto.validate import validate
from triplane.scheduler.compiler.costmodel import NodeFigures
from triplane.scheduler.compiler.jobplan import JobPlan, plan_job
from triplane.scheduler.compiler.layout import Layout
from triplane.scheduler.compiler.pipeline import PlanCache
from triplane.scheduler.compiler.placement import Placement
from triplane.scheduler.residency import Residency

U = "u-" + "ab" * 16
V = "u-" + "cd" * 16
MiB = 1 << 20


def test_learns_from_completed_tasks_and_forgets_a_node_that_goes_down() -> None:
    r = Residency()
    r.learn("e1", [f"{U}@0:2,0:3", V])
    r.learn("e0", [f"{U}@0:2,0:3"])
    assert r.holders(f"{U}@0:2,0:3") == ("e0", "e1") and r.holders(V) == ("e1",) and len(r) == 2
    r.forget_node("e1")
    assert r.holders(f"{U}@0:2,0:3") == ("e0",) and r.holders(V) == () and len(r) == 1


def test_an_executor_that_evicted_since_its_last_report_is_forgotten() -> None:
    r = Residency()
    r.learn("e0", [U])
    r.evicted("e0", 0)
    assert r.holders(U) == ("e0",)
    r.evicted("e0", 3)  # the counter grew: which entries went is not said
    assert r.holders(U) == ()
    r.learn("e0", [U])
    r.evicted("e0", 3)  # unchanged: knowledge stays
    assert r.holders(U) == ("e0",)


def test_an_executor_naming_its_losses_forgets_just_those() -> None:
    r = Residency()
    w = "u-" + "ef" * 16
    r.learn("e0", [U, V, w])
    r.learn("e1", [U])
    r.evicted("e0", 0)
    r.evicted("e0", 1, [U])  # one loss, named
    assert (r.holders(U), r.holders(V), r.holders(w)) == (("e1",), ("e0",), ("e0",))
    r.evicted("e0", 2, [U, V])  # one more: the last name is the new loss
    assert (r.holders(U), r.holders(V), r.holders(w)) == (("e1",), (), ("e0",))
    assert len(r) == 2
    r.evicted("e0", 5, [U, V])  # grew by 3, two named: which went is not known
    assert (r.holders(U), r.holders(w)) == (("e1",), ())


def test_the_uploads_learned_longest_ago_go_beyond_capacity() -> None:
    r = Residency(capacity=3)
    r.learn("e0", [f"{U}@0:1", f"{U}@1:2"])
    r.learn("e0", [f"{V}@0:1", f"{V}@1:2"])  # 4 tiles > 3: U's go
    assert len(r) == 2 and r.holders(f"{U}@0:1") == () and r.holders(f"{V}@1:2") == ("e0",)


def test_lookup_maps_arguments_and_regions_to_holders() -> None:
    r = Residency()
    r.learn("e2", [f"{V}@0:5,5:9"])
    r.learn("e1", [U])
    cached = r.lookup([U, V])
    r.forget_node("e2")  # a snapshot: later changes do not affect a planning thread
    assert cached("arg1", ((0, 5), (5, 9))) == ("e2",)
    assert cached("arg0", None) == ("e1",)
    assert cached("arg0", ((0, 1),)) == () and cached("arg7", None) == () and cached("x", None) == ()


def _job(cached: Residency | None) -> tuple[JobPlan, Layout, Placement]:
    b = Builder()
    x = b.add_node("input", [], {"tensor": "arg0", "shape": (1200, 1100), "dtype": "float32"}, node_id="n0")
    b.add_node("exp", [x], {}, node_id="n1")
    g = validate(b.graph(["n1"]))
    figs = [NodeFigures(f"e{i}", 50.0, 10.0, 64 * MiB) for i in range(3)]
    plan = plan_job("j" + "0" * 16, g, [U], {"y": "n1"}, {"n1": "y", "n0": "x"}, PlanCache(), figures=figs,
                    explicit={"n1": {"d0": 500, "d1": 600}},
                    cached=cached.lookup([U]) if cached is not None else None)
    assert plan.layout is not None and plan.layout.placement is not None
    return plan, plan.layout, plan.layout.placement


def test_a_job_submitted_again_runs_each_task_where_its_upload_tile_is_cached() -> None:
    first, _, place1 = _job(None)
    tasks = sorted(first.templates)
    assert len(tasks) == 6
    # Without the knowledge every tile is pulled from the scheduler.
    assert all(p.source == "scheduler" for t in tasks for p in place1.tasks[t].pulls)
    r = Residency()
    # Say each tile went to the node after the one placement chose: the second layout
    # must follow the residency, not merely repeat its own deterministic choice.
    where = {}
    for task in tasks:
        where[task] = f"e{(int(place1.tasks[task].node[1:]) + 1) % 3}"
        r.learn(where[task], first.templates[task].uploads)
    second, lay2, place2 = _job(r)
    for task in tasks:
        assert place2.tasks[task].node == where[task], task
        assert place2.tasks[task].pulls == () and place2.tasks[task].comm_s == 0.0
    assert len(lay2.cached) == 6 and all(len(v) == 1 for v in lay2.cached.values())
    assert [s.node for s in second.specs] == [where[s.id] for s in second.specs]  # dispatched there
    assert place2.to_dict() == _job(r)[2].to_dict()  # deterministic


def test_read_evictions_forgets_the_nodes_whose_published_losses_grew() -> None:
    import asyncio
    import json

    from triplane.registry import MemoryBackend
    from triplane.scheduler.residency import read_evictions

    def stats(evictions: int, refused: int = 0, lost: object = None) -> bytes:
        cache = {"evictions": evictions, "refused": refused, "dropped": 0}
        return json.dumps({"cache": cache if lost is None else {**cache, "lost": lost}}).encode()

    async def go() -> Residency:
        reg = MemoryBackend()
        r = Residency()
        r.learn("e0", [U])
        r.learn("e1", [U])
        await reg.put("stats/e0", stats(0))
        await reg.put("stats/e1", stats(0))
        await reg.put("stats/odd", b"not json")  # skipped
        await read_evictions(reg, r)
        assert r.holders(U) == ("e0", "e1")
        await reg.put("stats/e1", stats(0, refused=1))  # e1 could not keep a tile it read
        await read_evictions(reg, r)
        assert r.holders(U) == ("e0",)
        r.learn("e0", [V])
        await reg.put("stats/e0", stats(1, lost=[V]))  # named: U stays known there
        await read_evictions(reg, r)
        assert (r.holders(U), r.holders(V)) == (("e0",), ())
        await reg.put("stats/e0", stats(2, lost=[V, 7]))  # malformed names: all of e0 goes
        await read_evictions(reg, r)
        return r

    assert asyncio.run(go()).holders(U) == ()
