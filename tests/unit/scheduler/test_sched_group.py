"""A tiny job as one grouped task (triplane.scheduler.compiler.group): the planning
decision, the packet form and its fallbacks; pure, no sockets."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from triplane.engines import get_op_engine
from triplane.executor.group import prepare, run_prepared
from triplane.proto.ir import Graph
from triplane.proto.packet import TaskPacket, decode
from triplane.proto.packet.group import GROUP_OP, parse_program
from triplane.scheduler.compiler import PlanCache, jobplan
from triplane.scheduler.compiler.compile import compile_job
from triplane.scheduler.compiler.group import GROUP_TASK, MAX_GROUP_TASKS
from triplane.scheduler.dispatch.events import NodeUp, SubmitJob
from triplane.scheduler.dispatch.shell import DispatchShell
from triplane.scheduler.dispatch.state import DispatchState, Send, TaskErred
from triplane.scheduler.earlier import plan_again
from triplane.scheduler.jobrecords import bindings_of

X = "u-" + "ab" * 16
W = "u-" + "cd" * 16
JOB = "j0000000000000001"


def mlp(batch: int = 4) -> Graph:
    """x @ w, tanh, a sum and a scaled copy: four task nodes, two fetched."""
    nodes: dict[str, Any] = {
        "x": {"op": "input", "shape": [batch, 3], "dtype": "float32",
              "attrs": {"tensor": X, "shape": [batch, 3], "dtype": "float32"}},
        "w": {"op": "input", "shape": [3, 2], "dtype": "float32",
              "attrs": {"tensor": W, "shape": [3, 2], "dtype": "float32"}},
        "h": {"op": "matmul", "inputs": ["x", "w"], "shape": [batch, 2], "dtype": "float32"},
        "a": {"op": "tanh", "inputs": ["h"], "shape": [batch, 2], "dtype": "float32"},
        "loss": {"op": "sum", "inputs": ["a"], "shape": [], "dtype": "float32"},
        "w2": {"op": "mul", "inputs": ["w", "w"], "shape": [3, 2], "dtype": "float32"},
    }
    return Graph.from_dict({"version": 1, "nodes": nodes, "outputs": ["loss", "w2"]})


def chain(n: int) -> Graph:
    nodes: dict[str, Any] = {"c0": {"op": "normal", "shape": [2], "dtype": "float32",
                                    "attrs": {"seed": 1, "shape": [2], "dtype": "float32"}}}
    for i in range(1, n):
        nodes[f"c{i}"] = {"op": "neg", "inputs": [f"c{i - 1}"], "shape": [2], "dtype": "float32"}
    return Graph.from_dict({"version": 1, "nodes": nodes, "outputs": [f"c{n - 1}"]})


def test_a_tiny_job_is_one_grouped_task_whose_tiles_are_named_by_node() -> None:
    jp = compile_job(mlp(), ["loss", "w2"], cache=PlanCache(), job=JOB)
    assert [s.id for s in jp.specs] == [GROUP_TASK]
    spec = jp.specs[0]
    assert spec.op == GROUP_OP and spec.deps == () and spec.is_output and spec.cost_s > 0
    per_node = compile_job(mlp(), ["loss", "w2"], cache=PlanCache(), group=False)
    assert len(per_node.specs) == 3  # matmul, tanh+sum fused, mul
    assert jp.ops == per_node.ops == {"matmul", "fused", "mul"}  # what engines must run: the nodes' ops
    tpl = jp.templates[GROUP_TASK]
    assert sorted(tpl.inputs) == sorted([X, W]) and set(tpl.uploads) == {X, W}
    loss, w2 = jp.fetch["loss"], jp.fetch["w2"]
    assert set(tpl.tiles) == {loss, w2} and jp.group == {loss: GROUP_TASK, w2: GROUP_TASK}
    assert jp.fetch_tile("loss") == (f"{JOB}.{loss}", GROUP_TASK)  # the tile, and the task holding it
    assert set(jp.task_tiles(GROUP_TASK)) == {f"{JOB}.{loss}", f"{JOB}.{w2}"}
    assert spec.output_bytes == 4 + 24
    prog = parse_program(tpl.attrs["program"], len(tpl.inputs), len(tpl.tiles))
    assert sorted(n.id for n in prog.nodes) == sorted(per_node.templates)
    assert prog.inputs[tpl.inputs.index(X)] == ((4, 3), "float32")


def test_the_program_computes_what_numpy_does() -> None:
    jp = compile_job(mlp(), ["loss", "w2"], cache=PlanCache(), job=JOB)
    tpl = jp.templates[GROUP_TASK]
    rng = np.random.default_rng(0)
    data = {X: rng.standard_normal((4, 3)).astype(np.float32),
            W: rng.standard_normal((3, 2)).astype(np.float32)}
    engine = get_op_engine("numpy")
    prep = prepare(tpl.attrs["program"], len(tpl.inputs), len(tpl.tiles), engine)
    outs = dict(zip(tpl.tiles, run_prepared(prep, [data[t] for t in tpl.inputs], engine)))
    np.testing.assert_allclose(outs[jp.fetch["loss"]], np.tanh(data[X] @ data[W]).sum(), rtol=1e-6)
    np.testing.assert_allclose(outs[jp.fetch["w2"]], data[W] * data[W], rtol=1e-6)
    # intermediates die after their last reader; the outputs never do
    freed = {s for step in prep.steps for s in step.free}
    assert freed and not freed & set(prep.out)


def test_the_program_is_the_same_text_every_step_and_written_once() -> None:
    cache = PlanCache()
    a = compile_job(mlp(), ["loss", "w2"], cache=cache)
    b = compile_job(mlp(), ["loss", "w2"], cache=cache)
    assert a.job != b.job
    assert a.templates[GROUP_TASK].attrs["program"] is b.templates[GROUP_TASK].attrs["program"]


def test_jobs_that_are_not_grouped() -> None:
    cache = PlanCache()
    one = compile_job(chain(1), ["c0"], cache=cache)  # one task: nothing to gain
    assert [s.op for s in one.specs] == ["normal"] and not one.group
    many = compile_job(chain(MAX_GROUP_TASKS + 1), [f"c{MAX_GROUP_TASKS}"], cache=cache,
                       options=None)
    # a long chain fuses into few tasks; unfused, it is too many for one group
    assert len(many.specs) <= MAX_GROUP_TASKS or not many.group
    from triplane.scheduler.compiler.pipeline import CompileOptions

    unfused = compile_job(chain(MAX_GROUP_TASKS + 2), [f"c{MAX_GROUP_TASKS + 1}"], cache=cache,
                          options=CompileOptions(fuse=False))
    assert len(unfused.specs) == MAX_GROUP_TASKS + 2 and not unfused.group
    off = compile_job(mlp(), ["loss", "w2"], cache=cache, group=False)
    assert len(off.specs) == 3 and not off.group
    big = compile_job(mlp(batch=1 << 19), ["loss", "w2"], cache=cache)  # 6 MiB of x: not tiny
    assert not big.group and GROUP_TASK not in big.templates


def test_a_program_too_big_for_a_packet_falls_back_to_one_task_per_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobplan, "MAX_ATTRS_BYTES", 200)  # the program's 259 bytes do not fit, each node's do
    jp = compile_job(mlp(), ["loss", "w2"], cache=PlanCache(), job=JOB)
    assert len(jp.specs) == 3 and not jp.group and GROUP_TASK not in jp.templates


def test_a_stored_grouped_job_compiles_again_to_the_same_task() -> None:
    cache = PlanCache()
    jp = compile_job(mlp(), ["loss", "w2"], cache=cache, job=JOB)
    bindings = bindings_of(jp)
    assert bindings["grouped"] is True
    again = plan_again(JOB, jp.graph, bindings, PlanCache())
    assert [s.id for s in again.specs] == [GROUP_TASK] and again.group == jp.group
    assert again.templates[GROUP_TASK] == jp.templates[GROUP_TASK]
    old = plan_again(JOB, jp.graph, {k: v for k, v in bindings.items() if k != "grouped"}, PlanCache())
    assert len(old.specs) == 3  # a record written before grouping: one task per node, as it ran


def test_the_packet_of_a_grouped_task_names_every_output_tile() -> None:
    jp = compile_job(mlp(), ["loss", "w2"], cache=PlanCache(), job=JOB)
    secret = b"s" * 32
    shell = DispatchShell(DispatchState(), secret, {JOB: dict(jp.templates)})
    data = shell.packet_for(Send(JOB, GROUP_TASK, 0, "e1", time.time() + 10, ()))
    p = decode(data, secret, max_bytes=65536)
    assert isinstance(p, TaskPacket) and p.op == GROUP_OP
    assert set(p.outputs) == set(jp.task_tiles(GROUP_TASK))
    assert p.pull_from == {X: "scheduler", W: "scheduler"}
    assert p.attrs == {"program": jp.templates[GROUP_TASK].attrs["program"]}


def test_a_grouped_tasks_packet_carries_the_values_it_is_given_up_to_the_bound() -> None:
    from triplane.proto.packet import CARRY_MAX_BYTES, Carried

    jp = compile_job(mlp(), ["loss", "w2"], cache=PlanCache(), job=JOB)
    secret = b"s" * 32
    shell = DispatchShell(DispatchState(), secret, {JOB: dict(jp.templates)})
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 3)).astype(np.float32)
    values: dict[str, Carried] = {X: Carried((4, 3), "float32", x.tobytes())}
    asked: list[tuple[str, str]] = []

    def carry(node: str, tile: str) -> Carried | None:
        asked.append((node, tile))
        return values.get(tile)

    shell.carry = carry
    p = decode(shell.packet_for(Send(JOB, GROUP_TASK, 0, "e1", time.time() + 10, ())), secret,
               max_bytes=65536)
    assert isinstance(p, TaskPacket) and sorted(asked) == [("e1", X), ("e1", W)]
    assert p.pull_from == {W: "scheduler"} and set(p.data) == {X}
    assert np.array_equal(np.frombuffer(p.data[X].data, np.float32).reshape(4, 3), x)
    # More than the bound in all: what does not fit is pulled.
    big = CARRY_MAX_BYTES // 4 - 1
    values = {X: Carried((big,), "float32", bytes(big * 4)), W: Carried((3, 2), "float32", bytes(24))}
    p = decode(shell.packet_for(Send(JOB, GROUP_TASK, 0, "e1", time.time() + 10, ())), secret,
               max_bytes=65536)
    assert isinstance(p, TaskPacket) and set(p.data) == {X} and p.pull_from == {W: "scheduler"}


def test_a_user_error_inside_a_group_names_the_node_that_failed() -> None:
    s = DispatchState()
    s.handle(NodeUp("up", "e1", 2, 0.0))
    jp = compile_job(mlp(), ["loss", "w2"], cache=PlanCache(), job=JOB)
    out = s.handle(SubmitJob("sub", JOB, jp.specs, 0.0))
    assert any(isinstance(i, Send) and i.task == GROUP_TASK for i in out)
    out = s.handle(TaskErred("err", JOB, GROUP_TASK, 0, "e1", "user", "matmul: bad", 1.0, at="n2"))
    err = s.jobs[JOB].tasks[GROUP_TASK].error
    assert err is not None and err.task == "n2" and err.op == GROUP_OP and err.kind == "user"


def test_releasing_a_grouped_job_deletes_every_tile_it_stored() -> None:
    import asyncio

    from triplane.scheduler.livejob import LiveJob
    from triplane.scheduler.results import Results

    jp = compile_job(mlp(), ["loss"], cache=PlanCache(), job=JOB)  # w2 an output, not fetched
    live = LiveJob(jp, dict(jp.back), 0.0, 0.0, state="done", holders={GROUP_TASK: "e1"})
    deleted: list[dict[str, list[str]]] = []
    results = Results.__new__(Results)
    results.shell = DispatchShell(DispatchState(), b"s" * 32, {})

    async def delete(job: str, by_node: dict[str, list[str]]) -> None:
        deleted.append({n: sorted(t) for n, t in by_node.items()})

    results._delete_tiles = delete  # type: ignore[method-assign]
    results._release_again = lambda job, by_node: None  # type: ignore[method-assign]
    asyncio.run(results.release(JOB, live, keep_fetched=True))
    assert deleted == [{}]  # the group holds a fetched tile: kept whole until the job's release
    asyncio.run(results.release(JOB, live, keep_fetched=False))
    assert deleted[-1] == {"e1": sorted(jp.task_tiles(GROUP_TASK))} and len(jp.task_tiles(GROUP_TASK)) == 2


@pytest.mark.parametrize(("state", "retried", "again"), [
    ("done", False, False),  # every task ran once and ended: nothing can store a tile later
    ("done", True, True),  # an attempt drifted away from may still be running
    ("cancelled", False, True),  # a task running at the cancel stores its tile when it ends
    ("running", False, True),
])
def test_a_release_is_repeated_only_where_a_running_attempt_may_store_a_tile_later(
        state: str, retried: bool, again: bool) -> None:
    import asyncio

    from triplane.scheduler.livejob import LiveJob
    from triplane.scheduler.results import Results

    jp = compile_job(mlp(), ["loss"], cache=PlanCache(), job=JOB)
    live = LiveJob(jp, dict(jp.back), 0.0, 0.0, state=state, holders={GROUP_TASK: "e1"}, retried=retried)
    repeated: list[str] = []
    results = Results.__new__(Results)
    results.shell = DispatchShell(DispatchState(), b"s" * 32, {})

    async def delete(job: str, by_node: dict[str, list[str]]) -> None:
        pass

    results._delete_tiles = delete  # type: ignore[method-assign]
    results._release_again = lambda job, by_node: repeated.append(job)  # type: ignore[method-assign]
    asyncio.run(results.release(JOB, live, keep_fetched=False))
    assert repeated == ([JOB] if again else [])


def test_a_compiled_step_binds_the_last_plan_to_its_job_and_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored graph planned again with other arguments (a compiled step) is the last plan
    bound to the new job and inputs: the same as planning it in full, without the walk."""
    cache = PlanCache()
    jp = compile_job(mlp(), ["loss", "w2"], cache=cache, job=JOB)
    cgraph, fetch = jp.graph, dict(jp.fetch)
    assert cgraph is not None
    first = compile_job(cgraph, fetch, cache=cache, job="j0000000000000002", args=[X, W])
    walks: list[str] = []
    real = jobplan._plan_job
    monkeypatch.setattr(jobplan, "_plan_job", lambda job, *a: walks.append(job) or real(job, *a))
    x2, w2 = "u-" + "12" * 16, "j00000000000000aa.n5"
    step = compile_job(cgraph, fetch, cache=cache, job="j0000000000000003", args=[x2, w2])
    assert walks == []  # bound, not planned
    monkeypatch.setattr(jobplan, "_BOUND", type(jobplan._BOUND)())  # forget it: planned in full
    full = compile_job(cgraph, fetch, cache=cache, job="j0000000000000003", args=[x2, w2])
    assert walks == ["j0000000000000003"]
    assert step == full and step.args == (x2, w2) and step.job == "j0000000000000003"
    assert step.templates[GROUP_TASK].inputs != first.templates[GROUP_TASK].inputs
    assert set(step.templates[GROUP_TASK].inputs) == {x2, w2} and step.uploads == full.uploads
    walks.clear()
    twice = compile_job(cgraph, fetch, cache=cache, job="j0000000000000004", args=[x2, x2])  # bound
    assert walks == [] and twice.templates[GROUP_TASK].uploads == (x2,)
    monkeypatch.setattr(jobplan, "_BOUND", type(jobplan._BOUND)())
    assert twice == compile_job(cgraph, fetch, cache=cache, job="j0000000000000004", args=[x2, x2])
    walks.clear()
    compile_job(cgraph, fetch, cache=cache, job="j0000000000000005", args=[x2, x2])
    assert walks == ["j0000000000000005"]  # a plan made for an argument given twice is not kept
    with pytest.raises(Exception, match="not an uploaded tensor id"):  # bad input: the full error
        compile_job(cgraph, fetch, cache=cache, job="j0000000000000006", args=[x2, "nope"])
    monkeypatch.setattr(jobplan, "REPLAN_S", 0.0)
    walks.clear()
    compile_job(cgraph, fetch, cache=cache, job="j0000000000000007", args=[X, W])
    assert walks == ["j0000000000000007"]  # due again: planned in full
