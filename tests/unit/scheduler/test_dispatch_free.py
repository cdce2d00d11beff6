"""Intermediates: the state machine frees a tile exactly when its last reader is done,
never a fetched output, and recomputes a freed tile a reader needs again (lineage)."""

from __future__ import annotations

import random

from triplane.scheduler.dispatch.state import (
    DispatchState,
    Free,
    JobFinished,
    NodeDown,
    NodeUp,
    Policy,
    Send,
    SubmitJob,
    TaskErred,
    TaskSpec,
    TaskSucceeded,
    Tick,
)

_sid = iter(range(10**9))


def sid() -> str:
    return f"s{next(_sid)}"


def sends(out: list) -> list[Send]:
    return [i for i in out if isinstance(i, Send)]


def frees(out: list) -> list[tuple[str, str]]:
    return [(i.task, i.node) for i in out if isinstance(i, Free)]


def cluster(*nodes: str, slots: int = 2, **knobs: object) -> DispatchState:
    s = DispatchState(Policy(retry_backoff_s=0.0, **knobs))  # type: ignore[arg-type]
    for n in nodes:
        s.handle(NodeUp(sid(), n, slots, 0.0))
    return s


def ok(s: DispatchState, send: Send, now: float = 1.0) -> list:
    out = s.handle(TaskSucceeded(sid(), send.job, send.task, send.attempt, send.node, now))
    s.validate_state()
    return out


def chain(n: int, node: str | None = None) -> tuple[TaskSpec, ...]:
    return tuple(TaskSpec(f"t{i}", "exp", (f"t{i - 1}",) if i else (), output_bytes=100,
                          is_output=i == n - 1, node=node) for i in range(n))


def test_a_chain_frees_each_input_when_its_reader_is_done_and_keeps_the_output() -> None:
    s = cluster("n1")
    out = s.handle(SubmitJob(sid(), "j", chain(5), 0.0))
    freed: list[tuple[str, str]] = []
    for i in range(5):
        (snd,) = sends(out)
        assert snd.task == f"t{i}"
        out = ok(s, snd)
        freed += frees(out)
        # t(i-1) goes with t(i)'s reply, not earlier
        assert freed == [(f"t{k}", "n1") for k in range(i)]
    assert [f for f in out if isinstance(f, JobFinished)] == [JobFinished("j", "done")]
    assert s.jobs["j"].tasks["t4"].node == "n1"  # the fetched output stays where it is
    assert all(s.jobs["j"].tasks[f"t{k}"].node is None for k in range(4))


def test_a_tile_read_twice_goes_with_its_last_reader() -> None:
    s = cluster("n1", "n2")
    tasks = (TaskSpec("a", "full"), TaskSpec("b", "exp", ("a",)), TaskSpec("c", "neg", ("a",)),
             TaskSpec("d", "add", ("b", "c"), is_output=True))
    (a,) = sends(s.handle(SubmitJob(sid(), "j", tasks, 0.0)))
    by = {x.task: x for x in sends(ok(s, a))}
    out = ok(s, by["b"])
    assert frees(out) == []  # c still reads a
    out = ok(s, by["c"])
    assert frees(out) == [("a", a.node)]
    (d,) = sends(out)
    out = ok(s, d)
    assert sorted(frees(out)) == [("b", by["b"].node), ("c", by["c"].node)]


def test_fetched_outputs_are_never_freed_even_when_read() -> None:
    s = cluster("n1")
    tasks = (TaskSpec("a", "full", is_output=True), TaskSpec("b", "exp", ("a",), is_output=True))
    (a,) = sends(s.handle(SubmitJob(sid(), "j", tasks, 0.0)))
    (b,) = sends(ok(s, a))
    assert frees(ok(s, b)) == []


def test_a_tile_nobody_reads_and_nobody_fetches_goes_at_once() -> None:
    s = cluster("n1")
    tasks = (TaskSpec("dead", "full"), TaskSpec("out", "full", is_output=True))
    by = {x.task: x for x in sends(s.handle(SubmitJob(sid(), "j", tasks, 0.0)))}
    assert frees(ok(s, by["dead"])) == [("dead", "n1")]
    assert frees(ok(s, by["out"])) == []


def test_the_policy_can_keep_intermediates() -> None:
    s = cluster("n1", free_intermediates=False)
    out = s.handle(SubmitJob(sid(), "j", chain(3), 0.0))
    while sends(out):
        (snd,) = sends(out)
        out = ok(s, snd)
        assert frees(out) == []


def test_a_reader_run_again_after_its_input_was_freed_recomputes_it_from_lineage() -> None:
    # t0 -> t1 -> t2 on n1, t3 (fetched) on n2; n1 dies after t0 and t1 are freed, while
    # t3 still needs t2: t2 is recomputed, and so are its freed inputs t1 and t0.
    s = cluster("n1", "n2", eager=False)
    specs = (*chain(3, "n1")[:2], TaskSpec("t2", "exp", ("t1",), node="n1"),
             TaskSpec("t3", "exp", ("t2",), is_output=True, node="n2"))
    out = s.handle(SubmitJob(sid(), "j", specs, 0.0))
    freed: list[tuple[str, str]] = []
    for want in ("t0", "t1", "t2"):
        (snd,) = sends(out)
        assert (snd.task, snd.node) == (want, "n1")
        out = ok(s, snd)
        freed += frees(out)
    assert freed == [("t0", "n1"), ("t1", "n1")]
    (t3,) = sends(out)
    assert t3.node == "n2" and t3.pull_from == (("t2", "n1"),)
    out = s.handle(NodeDown(sid(), "n1", 2.0))  # t3's pull of t2 fails with it
    s.validate_state()
    out += s.handle(TaskErred(sid(), "j", "t3", 0, "n2", "infra", "pull failed", 2.1, "j.t2", "n1"))
    s.validate_state()
    tasks = s.jobs["j"].tasks
    assert tasks["t3"].state == "pending" and tasks["t3"].waiting_on == {"t2"}
    assert tasks["t2"].state == "pending" and tasks["t1"].state == "pending"
    (redo,) = sends(out)
    assert (redo.task, redo.node, redo.attempt) == ("t0", "n2", 1)
    now, freed = 3.0, []
    for want in ("t1", "t2", "t3"):
        out = ok(s, redo, now)
        freed += frees(out)
        (redo,) = sends(out)
        assert redo.task == want and redo.node == "n2"
        now += 1
    out = ok(s, redo, now)
    freed += frees(out)
    assert freed == [("t0", "n2"), ("t1", "n2"), ("t2", "n2")]
    assert [f.state for f in out if isinstance(f, JobFinished)] == ["done"]


def test_an_input_its_holder_no_longer_has_is_recomputed_not_blamed_on_the_node() -> None:
    # A resumed job: the metadb said t0 is done on n1, but n1 freed it before the scheduler
    # restarted (or evicted it, or restarted itself). t1 runs on n1 and n1 says so: t0 is
    # recomputed from lineage, and t1 runs after it -- on n1 still, which did nothing wrong.
    s = cluster("n1", "n2", eager=False)
    specs = (*chain(2, "n1"), TaskSpec("t2", "exp", ("t1",), is_output=True, node="n1"))
    (t1,) = sends(s.handle(SubmitJob(sid(), "j", specs, 0.0, done=(("t0", "n1"),))))
    assert (t1.task, t1.node, t1.pull_from) == ("t1", "n1", ())
    out = s.handle(TaskErred(sid(), "j", "t1", 0, "n1", "infra", "input tile j.t0 is not held on node n1",
                             1.0, "j.t0", "n1"))
    s.validate_state()
    tasks = s.jobs["j"].tasks
    assert tasks["t1"].state == "pending" and tasks["t1"].waiting_on == {"t0"}
    assert tasks["t1"].excluded == set()
    (redo,) = sends(out)
    assert (redo.task, redo.node, redo.attempt) == ("t0", "n1", 1)
    now = 2.0
    for want in ("t1", "t2"):
        (redo,) = sends(ok(s, redo, now))
        assert redo.task == want and redo.node == "n1"
        now += 1
    assert [f.state for f in ok(s, redo, now) if isinstance(f, JobFinished)] == ["done"]


def test_under_random_failures_frees_name_only_done_unfetched_tiles_once_unread() -> None:
    rnd = random.Random(7)
    for _ in range(30):
        s = cluster("n1", "n2", "n3")
        n = rnd.randint(3, 25)
        specs = []
        for i in range(n):
            deps = tuple(sorted({f"t{rnd.randrange(i)}" for _ in range(rnd.randint(0, 2))})) if i else ()
            specs.append(TaskSpec(f"t{i}", "op", deps, is_output=rnd.random() < 0.2 or i == n - 1))
        out = s.handle(SubmitJob(sid(), "j", tuple(specs), 0.0))
        by = {x.id: x for x in specs}
        now, pending = 0.0, sends(out)
        while s.jobs["j"].state == "running" and now < 200:
            now += 0.1
            if rnd.random() < 0.03:
                victim = rnd.choice(["n1", "n2", "n3"])
                out = s.handle(NodeDown(sid(), victim, now)) + s.handle(NodeUp(sid(), victim, 2, now))
            elif pending:
                snd = pending.pop(rnd.randrange(len(pending)))
                out = s.handle(TaskSucceeded(sid(), "j", snd.task, snd.attempt, snd.node, now))
            else:
                out = s.handle(Tick(sid(), now + 10))
                now += 10
            s.validate_state()
            tasks = s.jobs["j"].tasks
            for task, _node in frees(out):
                assert not by[task].is_output
                assert tasks[task].state == "done"
                assert all(tasks[r].state == "done" for r in tasks[task].dependents)
            pending += sends(out)
        assert s.jobs["j"].state == "done"
