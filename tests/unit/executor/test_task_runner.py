"""Running one task: results, error kinds, capacity, pulls (pure: a fake puller, no sockets)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from triplane.engines import get_op_engine
from triplane.engines.memory.host import HostMemoryEngine
from triplane.executor.tasks import MAX_MESSAGE_CHARS, TaskRunner, stall_from_env
from triplane.proto import dtypes as dt
from triplane.proto.errors import KernelError
from triplane.proto.packet import Reply, TaskPacket


class Peers:
    """A fake of the data-port pull: tiles by (node, tile); anything else raises."""

    def __init__(self, tiles: dict[tuple[str, str], np.ndarray]) -> None:
        self.tiles = tiles
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, node: str, tile: str) -> np.ndarray:
        self.calls.append((node, tile))
        if (node, tile) not in self.tiles:
            raise ConnectionError(f"no such tile: {tile}")
        return self.tiles[(node, tile)]


def run(runner: TaskRunner, task: TaskPacket, **kw: Any) -> Reply:
    async def go() -> Reply:
        return await runner.run(task, time.time(), **kw)

    return asyncio.run(asyncio.wait_for(go(), 10))


def make(capacity: int = 1 << 20, peers: Peers | None = None, engine: Any = None,
         **kw: Any) -> tuple[TaskRunner, HostMemoryEngine]:
    store = HostMemoryEngine(capacity)
    runner = TaskRunner(engine or get_op_engine("numpy"), store, peers or Peers({}), node="me", **kw)
    return runner, store


def t(task_id: str, op: str, ins: tuple[str, ...], out: str = "o", pull: dict | None = None,
      attrs: dict | None = None) -> TaskPacket:
    return TaskPacket(task_id, op, ins, (out,), time.time() + 30, pull or {}, attrs or {}, "me", time.time())


def test_ok_result_is_stored_and_described() -> None:
    runner, store = make()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    store.put("x", x)
    reply = run(runner, t("j.n1.a0", "matmul", ("x", "x"), "y"))
    assert not reply.ok and reply.error.kind == "user"  # (2,3) @ (2,3): inferred here, refused
    store.put("w", np.ones((3, 2), np.float32))
    reply = run(runner, t("j.n2.a0", "matmul", ("x", "w"), "y"))
    assert reply.ok and reply.error is None
    assert reply.outputs[0] == ("y", (2, 2), "float32", 16)
    np.testing.assert_array_equal(store.get("y"), x @ np.ones((3, 2), np.float32))
    assert reply.timings.queued <= reply.timings.start <= reply.timings.end


def test_inputs_named_in_from_are_pulled_once_and_not_kept() -> None:
    x = np.full((2, 2), 3.0, np.float32)
    peers = Peers({("n2", "x"): x})
    runner, store = make(peers=peers)
    reply = run(runner, t("j.n1.a0", "add", ("x", "x"), "y", pull={"x": "n2"}))
    assert reply.ok, reply.error
    assert peers.calls == [("n2", "x")] and "x" not in store
    np.testing.assert_array_equal(store.get("y"), x + x)
    assert runner.stats["pulled_bytes"] == x.nbytes


def test_pull_failure_and_missing_local_input_are_infra_errors() -> None:
    runner, _ = make()
    reply = run(runner, t("j.n1.a0", "neg", ("x",), pull={"x": "n2"}))
    assert not reply.ok and reply.error.kind == "infra"
    assert "pulling input x from node n2 failed" in reply.error.message and reply.outputs == ()
    assert (reply.error.node, reply.error.input) == ("n2", "x")  # as data: nobody parses the text
    reply = run(runner, t("j.n2.a0", "neg", ("z",)))
    assert reply.error.kind == "infra" and "input tile z is not held on node me" in reply.error.message
    assert (reply.error.node, reply.error.input) == ("me", "z")  # the scheduler recomputes z


def test_kernel_error_is_a_user_error() -> None:
    runner, store = make()
    store.put("x", np.ones(4, np.float32))
    store.put("i", np.array([7], np.int64))
    reply = run(runner, t("j.n1.a0", "gather", ("x", "i")))
    assert reply.error.kind == "user" and "out of range" in reply.error.message
    assert "o" not in store and store.free() == store.capacity() - 16 - 8  # reservation released


@pytest.mark.parametrize(("op", "attrs", "message"), [
    ("no_such_op", {}, "unknown op"),
    ("neg", {"bogus": 1}, "bogus"),
])
def test_bad_op_or_attrs_are_user_errors(op: str, attrs: dict, message: str) -> None:
    runner, store = make()
    store.put("x", np.ones(2, np.float32))
    reply = run(runner, t("j.n1.a0", op, ("x",), attrs=attrs))
    assert reply.error.kind == "user" and message in reply.error.message


def test_memory_full_is_infra_and_leaves_nothing_behind() -> None:
    runner, store = make(capacity=1000)
    reply = run(runner, t("j.n1.a0", "full", (), attrs={"value": 1.0, "shape": [1000]}))
    assert reply.error.kind == "infra" and reply.error.message.startswith("memory full")
    assert store.used() == 0 and store.free() == 1000


class Crashing:
    name, device = "crashy", "cpu"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def supports(self, op: str, dtypes: Any = ()) -> bool:
        return op != "matmul"

    def run(self, *a: Any) -> Any:
        raise self.exc


def test_engine_crash_is_infra_and_a_long_message_is_clipped() -> None:
    runner, store = make(engine=Crashing(RuntimeError("x" * 5000)))
    store.put("x", np.ones(2, np.float32))
    reply = run(runner, t("j.n1.a0", "neg", ("x",)))
    assert reply.error.kind == "infra" and "crashed: RuntimeError" in reply.error.message
    assert len(reply.error.message) <= MAX_MESSAGE_CHARS
    runner, store = make(engine=Crashing(KernelError("no kernel", kind="infra")))
    store.put("x", np.ones(2, np.float32))
    assert run(runner, t("j.n2.a0", "neg", ("x",))).error.kind == "infra"
    reply = run(runner, t("j.n3.a0", "matmul", ("x", "x")))
    assert reply.error.kind == "infra" and "does not support" in reply.error.message


def test_big_kernels_go_to_the_worker_thread_and_are_announced() -> None:
    runner, store = make(capacity=64 << 20, inline_bytes=1024)
    store.put("x", np.ones((256, 256), np.float32))
    slow: list[str] = []
    reply = run(runner, t("j.n1.a0", "neg", ("x",)), on_slow=slow.append)
    assert reply.ok and slow == ["j.n1.a0"]
    store.put("s", np.ones(4, np.float32))
    reply = run(runner, t("j.n2.a0", "neg", ("s",), "s2"), on_slow=slow.append)
    assert reply.ok and slow == ["j.n1.a0"]  # tiny: ran inline, no ack needed


class Sleepy:
    """A numpy engine whose kernels take ``seconds`` (the pool runs one at a time)."""

    name = "sleepy"

    def __init__(self, seconds: float) -> None:
        self.inner = get_op_engine("numpy")
        self.seconds = seconds

    def supports(self, op: str, dtypes: Any) -> bool:
        return self.inner.supports(op, dtypes)

    def run(self, *a: Any) -> Any:
        time.sleep(self.seconds)
        return self.inner.run(*a)


def test_a_task_queued_behind_another_kernel_reports_its_own_kernel_time() -> None:
    # Two tasks in flight on a one-thread pool: the second waits for the first's kernel.
    # Its reported start is when its kernel began, not when it was queued, so the plan's
    # actual times (end - start) are kernel times to set beside the predicted compute.
    runner, store = make(capacity=64 << 20, engine=Sleepy(0.2), inline_bytes=0)
    store.put("x", np.ones((64, 64), np.float32))

    async def both() -> list[Reply]:
        now = time.time()
        return list(await asyncio.gather(runner.run(t("j.n1.a0", "neg", ("x",), "y1"), now),
                                         runner.run(t("j.n2.a0", "neg", ("x",), "y2"), now)))

    first, second = sorted(asyncio.run(asyncio.wait_for(both(), 10)), key=lambda r: r.timings.start)
    assert first.ok and second.ok
    assert second.timings.start >= first.timings.end - 1e-3
    for r in (first, second):
        assert 0.19 <= r.timings.end - r.timings.start < 0.35, r.timings


class SleepyMatmul(Sleepy):
    """Matmuls take ``seconds``; the numpy engine's view kernels are cheap, as it says."""

    def cheap(self, op: str, inputs: Any) -> bool:
        return self.inner.cheap(op, inputs)

    def run(self, op: str, *a: Any) -> Any:
        if op == "matmul":
            time.sleep(self.seconds)
        return self.inner.run(op, *a)


def test_a_view_op_runs_at_once_not_behind_a_running_kernel() -> None:
    # Regrouping tiles is mostly slices and transposes, which numpy answers with views:
    # O(1) however big. Queued behind a long matmul in the one-thread pool, a 16 MiB
    # transpose held up the tasks waiting for it on another executor for 0.1-0.2 s.
    runner, store = make(capacity=256 << 20, engine=SleepyMatmul(0.3), inline_bytes=0)
    x = np.random.default_rng().standard_normal((1024, 1024), dtype=np.float32)
    store.put("x", x)

    async def both() -> tuple[Reply, Reply]:
        now = time.time()
        mm = asyncio.ensure_future(runner.run(t("j.n1.a0", "matmul", ("x", "x"), "mm"), now))
        await asyncio.sleep(0.05)  # the matmul holds the pool's one thread now
        tr = await runner.run(t("j.n2.a0", "transpose", ("x",), "xt", attrs={"perm": [1, 0]}), now)
        return await mm, tr

    mm, tr = asyncio.run(asyncio.wait_for(both(), 10))
    assert mm.ok and tr.ok, (mm.error, tr.error)
    assert tr.timings.end < mm.timings.end - 0.1  # done while the matmul still ran
    np.testing.assert_array_equal(store.get("xt"), x.T)
    assert get_op_engine("numpy").cheap("slice", [x]) and not get_op_engine("numpy").cheap("exp", [x])
    # bfloat16 runs in float32 and is rounded back: a copy, even for a view op
    assert not get_op_engine("numpy").cheap("slice", [x.astype(dt.bfloat16.np)])


def test_an_early_task_waits_for_its_input_made_here_and_starts_when_it_is() -> None:
    # The scheduler sends a task ahead of its input's task when both run here; the packet
    # names this node as the input's source. It must wait for that task, not fail.
    runner, store = make(capacity=64 << 20, engine=SleepyMatmul(0.2), inline_bytes=0)
    x = np.random.default_rng().standard_normal((32, 32), dtype=np.float32)
    store.put("x", x)
    acked: list[str] = []

    async def pair(first_after: float) -> tuple[Reply, Reply]:
        now = time.time()
        dep = asyncio.ensure_future(runner.run(t("j.b.a0", "exp", ("m",), "e", pull={"m": "me"}), now,
                                               on_slow=acked.append))
        await asyncio.sleep(first_after)  # the producer arrives after its dependent
        mm = await runner.run(t("j.a.a0", "matmul", ("x", "x"), "m"), now)
        return mm, await dep

    mm, dep = asyncio.run(asyncio.wait_for(pair(0.05), 10))
    assert mm.ok and dep.ok, (mm.error, dep.error)
    assert dep.timings.start >= mm.timings.end - 1e-3  # it ran on the made tile
    np.testing.assert_allclose(store.get("e"), np.exp(x @ x), rtol=1e-5)
    assert "j.b.a0" in acked  # delivered: the scheduler stops resending it meanwhile
    assert not runner._made and not runner._making  # nothing left behind


def test_an_early_task_fails_as_infra_when_its_input_task_fails_or_never_comes() -> None:
    runner, store = make(capacity=64 << 20, wait_for_input_s=0.2)
    store.put("x", np.ones((4, 3), np.float32))

    async def failing_producer() -> tuple[Reply, Reply]:
        now = time.time()
        dep = asyncio.ensure_future(runner.run(t("j.b.a0", "neg", ("m",), "e", pull={"m": "me"}), now))
        await asyncio.sleep(0.02)
        bad = await runner.run(t("j.a.a0", "matmul", ("x", "x"), "m"), now)  # (4,3) @ (4,3)
        return bad, await dep

    bad, dep = asyncio.run(asyncio.wait_for(failing_producer(), 10))
    assert not bad.ok and bad.error.kind == "user"
    assert not dep.ok and dep.error.kind == "infra"
    assert "input tile m was to be made on node me" in dep.error.message
    start = time.monotonic()
    lone = run(runner, t("j.c.a0", "neg", ("q",), "f", pull={"q": "me"}))  # its producer never comes
    assert not lone.ok and lone.error.kind == "infra" and "q was to be made" in lone.error.message
    assert 0.15 <= time.monotonic() - start < 2.0
    assert not runner._made and not runner._making and "e" not in store and "f" not in store


def test_an_early_task_waits_for_the_attempt_that_makes_its_input() -> None:
    # Two attempts of one task may make the same tile here (a recalled one still running):
    # the one that fails first must not fail the tasks waiting for the other's result.
    runner, store = make(capacity=64 << 20, engine=SleepyMatmul(0.2), inline_bytes=0)
    x = np.random.default_rng().standard_normal((16, 16), dtype=np.float32)
    store.put("x", x)
    store.put("bad", np.ones((3, 5), np.float32))

    async def go() -> tuple[Reply, Reply, Reply]:
        now = time.time()
        good = asyncio.ensure_future(runner.run(t("j.a.a1", "matmul", ("x", "x"), "m"), now))
        await asyncio.sleep(0.02)
        dep = asyncio.ensure_future(runner.run(t("j.b.a1", "neg", ("m",), "e", pull={"m": "me"}), now))
        await asyncio.sleep(0.02)  # it waits for m now
        failed = await runner.run(t("j.a.a0", "matmul", ("bad", "bad"), "m"), now)
        return failed, await good, await dep

    failed, good, dep = asyncio.run(asyncio.wait_for(go(), 10))
    assert not failed.ok and good.ok and dep.ok, (failed.error, good.error, dep.error)
    np.testing.assert_allclose(store.get("e"), -(x @ x), rtol=1e-5)
    assert not runner._made and not runner._making


def test_a_running_kernel_reports_its_start_until_it_ends() -> None:
    runner, store = make(capacity=64 << 20, engine=Sleepy(0.3), inline_bytes=0)
    store.put("x", np.ones((8, 8), np.float32))
    seen: list[float | None] = []

    async def go() -> Reply:
        task = asyncio.ensure_future(runner.run(t("j.n1.a0", "neg", ("x",)), time.time()))
        assert runner.running_since("j.n1.a0") is None  # not started yet
        await asyncio.sleep(0.15)
        seen.append(runner.running_since("j.n1.a0"))
        return await task

    t0 = time.time()
    reply = asyncio.run(asyncio.wait_for(go(), 10))
    assert reply.ok and seen[0] is not None and t0 <= seen[0] <= reply.timings.start + 1e-3
    assert runner.running_since("j.n1.a0") is None  # ended: no progress to report


def test_the_stall_fault_hangs_one_first_attempt_kernel_of_its_op() -> None:
    runner, store = make(capacity=64 << 20, inline_bytes=0, stall=("neg", 0.4))
    store.put("x", np.ones((8, 8), np.float32))
    t0 = time.time()
    assert run(runner, t("j.n1.a1", "neg", ("x",), "y0")).ok and time.time() - t0 < 0.3  # a retry
    assert run(runner, t("j.n2.a0", "exp", ("x",), "y1")).ok and time.time() - t0 < 0.3  # another op
    assert run(runner, t("j.n3.a0", "neg", ("x",), "y2")).ok and time.time() - t0 >= 0.4  # hung
    t1 = time.time()
    assert run(runner, t("j.n4.a0", "neg", ("x",), "y3")).ok and time.time() - t1 < 0.3  # once


def test_the_stall_fault_is_read_from_the_environment() -> None:
    assert stall_from_env({}) is None
    assert stall_from_env({"TRIPLANE_FAULT_STALL_KERNEL": "matmul:60"}) == ("matmul", 60.0)
    for bad in ("matmul", ":5", "matmul:x", "matmul:-1"):
        with pytest.raises(ValueError, match="TRIPLANE_FAULT_STALL_KERNEL"):
            stall_from_env({"TRIPLANE_FAULT_STALL_KERNEL": bad})


# --- grouped tasks (op graph: a tiny job's whole plan in one packet) ---------------------


def _program(nodes: list[tuple[str, str, list[int], dict]], out: list[int],
             ins: list[tuple[list[int], str]]) -> str:
    from triplane.proto.packet.group import ProgramNode, program_text

    return program_text(ins, [ProgramNode(i, op, tuple(s), a) for i, op, s, a in nodes], out)


def _group(task_id: str, text: str, ins: tuple[str, ...], outs: tuple[str, ...]) -> TaskPacket:
    return TaskPacket(task_id, "graph", ins, outs, time.time() + 30, {}, {"program": text}, "me", time.time())


def test_a_grouped_task_runs_its_program_and_stores_every_output() -> None:
    runner, store = make()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    store.put("x", x)
    store.put("w", w)
    text = _program([("n2", "matmul", [0, 1], {}), ("n3", "tanh", [2], {}), ("n4", "sum", [3], {}),
                     ("n5", "mul", [1, 1], {})], [4, 5], [([2, 3], "float32"), ([3, 2], "float32")])
    reply = run(runner, _group("j.g.a0", text, ("x", "w"), ("j.n4", "j.n5")))
    assert reply.ok, reply.error
    assert [o.tile for o in reply.outputs] == ["j.n4", "j.n5"]
    assert reply.outputs[0] == ("j.n4", (), "float32", 4)
    np.testing.assert_allclose(store.get("j.n4"), np.tanh(x @ w).sum(), rtol=1e-6)
    np.testing.assert_array_equal(store.get("j.n5"), w * w)
    assert "j.n3" not in store  # intermediates are not stored
    # the next step: the same program text, prepared once
    reply = run(runner, _group("j2.g.a0", text, ("x", "w"), ("j2.n4", "j2.n5")))
    assert reply.ok and runner.programs.misses == 1 and runner.programs.hits == 1


def test_a_failing_kernel_inside_a_group_names_its_node() -> None:
    runner, store = make()
    store.put("x", np.ones((2, 3), np.float32))
    # shapes that only the data shows wrong: the declared input is (3, 2), the tile (2, 3)
    text = _program([("n2", "neg", [0], {}), ("n3", "matmul", [1, 1], {})], [3],
                    [([2, 3], "float32"), ([2, 3], "float32")])
    reply = run(runner, _group("j.g.a0", text, ("x", "x"), ("j.n3",)))
    assert not reply.ok and reply.error.kind == "user" and reply.error.at == "n3"
    assert "matmul" in reply.error.message and "j.n3" not in store
    bad = _program([("n2", "neg", [0], {})], [1], [([3], "float32")])  # declares another type
    reply = run(runner, _group("j.g.a1", bad, ("x",), ("j.n2",)))
    assert not reply.ok and reply.error.kind == "user" and "declares" in reply.error.message
    broken = run(runner, _group("j.g.a2", "{not json", ("x",), ("j.n2",)))
    assert not broken.ok and broken.error.kind == "user" and "program" in broken.error.message


def test_a_kernel_error_inside_a_group_is_the_kernels_kind() -> None:
    class Faulty:
        name = "faulty"

        def __init__(self) -> None:
            self.inner = get_op_engine("numpy")

        def supports(self, op: str, dtypes: Any = ()) -> bool:
            return self.inner.supports(op, dtypes)

        def run(self, op: str, inputs: Any, attrs: Any, out: Any) -> np.ndarray:
            if op == "exp":
                raise KernelError("device lost", op=op, kind="infra")
            return self.inner.run(op, inputs, attrs, out)

    runner, store = make(engine=Faulty())
    store.put("x", np.ones(4, np.float32))
    text = _program([("n1", "neg", [0], {}), ("n2", "exp", [1], {})], [2], [([4], "float32")])
    reply = run(runner, _group("j.g.a0", text, ("x",), ("j.n2",)))
    assert not reply.ok and reply.error.kind == "infra" and reply.error.at == "n2"  # drifts, whole


def test_a_grouped_program_runs_bound_kernels_with_the_values_and_errors_of_engine_run() -> None:
    """The numpy engine's bound kernels (``bind``) in a grouped run give what ``engine.run``
    gives per kernel (an engine without ``bind``), IEEE's inf included and no warning, and a
    kernel failing at run time still names its node."""
    import warnings

    from triplane.executor.group import GroupError, prepare, run_prepared

    class Unbound:  # the numpy engine without bind: every kernel through engine.run
        def __init__(self, inner: Any) -> None:
            self.inner, self.name = inner, inner.name

        def supports(self, op: str, dtypes: Any) -> bool:
            return bool(self.inner.supports(op, dtypes))

        def run(self, *a: Any) -> Any:
            return self.inner.run(*a)

    numpy_engine = get_op_engine("numpy")
    text = _program([("n2", "div", [0, 1], {}), ("n3", "exp", [2], {}), ("n4", "add", [3, 0], {}),
                     ("n5", "sum", [4], {"axes": [1]})], [4, 5], [([2, 3], "float32"), ([2, 3], "float32")])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.array([[1, 0, 2], [4, 5, 0]], np.float32)  # two divisions by zero
    bound, plain = prepare(text, 2, 2, numpy_engine), prepare(text, 2, 2, Unbound(numpy_engine))
    assert all(s.call is not None for s in bound.steps) and all(s.call is None for s in plain.steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, want = run_prepared(bound, [x, y], numpy_engine), run_prepared(plain, [x, y], numpy_engine)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert np.isinf(got[0]).sum() == 2
    with pytest.raises(GroupError) as e:  # the declared types hold, the data does not
        run_prepared(bound, [x, np.ones((3, 2), np.float32)], numpy_engine)
    assert e.value.at == "n2" and e.value.kind == "user"


def test_a_small_group_runs_on_the_loop_and_a_big_or_stalled_one_in_the_pool(monkeypatch) -> None:
    """A group of few flops and bytes (a small model's step) runs on the event loop: no
    worker-thread hop; past either bound, or when the stall injection names one of its ops
    (it must hang a worker, not the loop), in the kernel pool."""
    from triplane.executor import tasks as tasks_mod

    runner, store = make(capacity=64 << 20, inline_bytes=0)
    here: list[str] = []
    real = runner._group_here
    monkeypatch.setattr(runner, "_group_here", lambda task_id, *a: here.append(task_id) or real(task_id, *a))
    x = np.ones((64, 64), np.float32)
    store.put("x", x)
    text = _program([("n1", "matmul", [0, 0], {}), ("n2", "tanh", [1], {})], [2], [([64, 64], "float32")])
    assert run(runner, _group("j1.g.a0", text, ("x",), ("j1.n2",))).ok and here == []
    np.testing.assert_allclose(store.get("j1.n2"), np.tanh(x @ x), rtol=1e-6)
    monkeypatch.setattr(tasks_mod, "GROUP_INLINE_FLOPS", 1.0)
    assert run(runner, _group("j2.g.a0", text, ("x",), ("j2.n2",))).ok and here == ["j2.g.a0"]
    monkeypatch.setattr(tasks_mod, "GROUP_INLINE_FLOPS", 2e7)
    runner._stall = ("tanh", 0.01)
    assert run(runner, _group("j3.g.a0", text, ("x",), ("j3.n2",))).ok and here == ["j2.g.a0", "j3.g.a0"]
