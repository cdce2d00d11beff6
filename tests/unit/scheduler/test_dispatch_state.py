"""The dispatcher's pure state machine: scheduling, retransmit, drift, lineage, failure."""

from __future__ import annotations

import random

import pytest

from triplane.scheduler.dispatch.state import (
    CancelJob,
    DispatchState,
    InvalidTransition,
    JobFinished,
    NodeDown,
    NodeUp,
    Policy,
    Send,
    SubmitJob,
    TaskAcked,
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


def finished(out: list) -> list[JobFinished]:
    return [i for i in out if isinstance(i, JobFinished)]


def cluster(*nodes: str, slots: int = 2, policy: Policy | None = None) -> DispatchState:
    # Retries without backoff unless a test asks for it: the rules read more plainly.
    s = DispatchState(policy or Policy(retry_backoff_s=0.0))
    for n in nodes:
        s.handle(NodeUp(sid(), n, slots, 0.0))
    return s


def chain(n: int) -> tuple[TaskSpec, ...]:
    return tuple(TaskSpec(f"t{i}", "exp", (f"t{i - 1}",) if i else (), output_bytes=100,
                          is_output=i == n - 1) for i in range(n))


def ok(s: DispatchState, send: Send, now: float = 1.0) -> list:
    out = s.handle(TaskSucceeded(sid(), send.job, send.task, send.attempt, send.node, now))
    s.validate_state()
    return out


def test_chain_runs_in_order_and_finishes() -> None:
    s = cluster("n1", "n2")
    out = s.handle(SubmitJob(sid(), "j1", chain(3), 0.0))
    for expected in ("t0", "t1", "t2"):
        (snd,) = sends(out)
        assert snd.task == expected and snd.attempt == 0
        out = ok(s, snd)
    assert finished(out) == [JobFinished("j1", "done")]
    assert all(t.state == "done" for t in s.tasks_of("j1"))


def test_slots_bound_tasks_in_flight() -> None:
    s = cluster("n1", "n2", slots=1)
    out = s.handle(SubmitJob(sid(), "j", tuple(TaskSpec(f"t{i}", "add") for i in range(5)), 0.0))
    first = sends(out)
    assert len(first) == 2 and {x.node for x in first} == {"n1", "n2"}
    out = ok(s, first[0])
    assert len(sends(out)) == 1  # a slot freed, one more task placed


def test_placement_prefers_the_node_holding_inputs() -> None:
    s = cluster("n1", "n2", slots=4)
    tasks = (TaskSpec("a", "full", output_bytes=10**6), TaskSpec("b", "full", output_bytes=10),
             TaskSpec("c", "add", ("a", "b")))
    out = s.handle(SubmitJob(sid(), "j", tasks, 0.0))
    by_task = {x.task: x for x in sends(out)}
    ok(s, by_task["a"])
    (c,) = sends(ok(s, by_task["b"]))
    assert c.node == by_task["a"].node  # the big input is there
    assert all(node != c.node for _, node in c.pull_from)


def test_deadline_miss_resends_then_drifts_and_stale_replies_are_ignored() -> None:
    s = cluster("n1", "n2", policy=Policy(min_timeout_s=1.0, max_sends=2, retry_backoff_s=0.0))
    (first,) = sends(s.handle(SubmitJob(sid(), "j", chain(1), 0.0)))
    (again,) = sends(s.handle(Tick(sid(), 1.5)))
    assert again.resend and again.attempt == 0 and again.node == first.node
    (moved,) = sends(s.handle(Tick(sid(), 3.0)))
    assert moved.attempt == 1 and moved.node != first.node and not moved.resend
    assert ok(s, first) == []  # the first attempt's late reply: ignored
    assert finished(ok(s, moved)) == [JobFinished("j", "done")]
    log = [(r.start, r.finish, r.attempt) for r in s.jobs["j"].tasks["t0"].log]
    assert log == [("pending", "ready", 0), ("ready", "dispatched", 0), ("dispatched", "ready", 1),
                   ("ready", "dispatched", 1), ("dispatched", "done", 1)]


def test_duplicate_replies_are_recorded_once() -> None:
    s = cluster("n1")
    (snd,) = sends(s.handle(SubmitJob(sid(), "j", chain(2), 0.0)))
    ok(s, snd)
    assert ok(s, snd) == []
    assert s.jobs["j"].remaining == 1


def test_infra_error_drifts_user_error_fails_the_job() -> None:
    s = cluster("n1", "n2")
    (snd,) = sends(s.handle(SubmitJob(sid(), "j", chain(2), 0.0)))
    out = s.handle(TaskErred(sid(), "j", "t0", 0, snd.node, "infra", "engine crashed", 1.0))
    (retry,) = sends(out)
    assert retry.attempt == 1 and retry.node != snd.node
    out = s.handle(TaskErred(sid(), "j", "t0", 1, retry.node, "user", "log of negative", 2.0))
    (fin,) = finished(out)
    assert fin.state == "failed" and fin.error is not None
    assert (fin.error.kind, fin.error.message, fin.error.task, fin.error.op, fin.error.node) == \
        ("user", "log of negative", "t0", "exp", retry.node)
    assert {t.state for t in s.tasks_of("j")} == {"failed", "cancelled"}
    s.validate_state()


def test_a_drifted_task_backs_off_before_it_is_placed_again() -> None:
    s = cluster("n1", "n2", policy=Policy(retry_backoff_s=0.1, max_backoff_s=0.3))
    (a,) = sends(s.handle(SubmitJob(sid(), "j", chain(1), 0.0)))
    assert sends(s.handle(TaskErred(sid(), "j", "t0", 0, a.node, "infra", "x", 1.0))) == []
    assert sends(s.handle(Tick(sid(), 1.05))) == []       # still backing off (0.1 s)
    (b,) = sends(s.handle(Tick(sid(), 1.11)))
    assert b.attempt == 1 and b.node != a.node
    s.handle(TaskErred(sid(), "j", "t0", 1, b.node, "infra", "y", 2.0))
    assert sends(s.handle(Tick(sid(), 2.15))) == []       # 0.2 s now
    (c,) = sends(s.handle(Tick(sid(), 2.21)))
    s.handle(TaskErred(sid(), "j", "t0", 2, c.node, "infra", "z", 3.0))
    assert sends(s.handle(Tick(sid(), 3.29))) == []       # 0.4 s, capped at 0.3
    assert len(sends(s.handle(Tick(sid(), 3.31)))) == 1
    s.validate_state()


def test_attempts_are_bounded() -> None:
    s = cluster("n1", "n2", policy=Policy(max_attempts=2, retry_backoff_s=0.0))
    (a,) = sends(s.handle(SubmitJob(sid(), "j", chain(1), 0.0)))
    (b,) = sends(s.handle(TaskErred(sid(), "j", "t0", 0, a.node, "infra", "x", 1.0)))
    (fin,) = finished(s.handle(TaskErred(sid(), "j", "t0", 1, b.node, "infra", "y", 2.0)))
    assert fin.state == "failed" and fin.error is not None
    assert fin.error.kind == "infra" and fin.error.attempts == 2 and fin.error.node == b.node
    assert "gave up after 2 attempts" in fin.error.message


def test_node_loss_drifts_running_tasks_and_recomputes_lost_outputs() -> None:
    s = cluster("n1", "n2", slots=1)
    s.handle(NodeDown(sid(), "n2", 0.0))  # everything starts on n1
    out = s.handle(SubmitJob(sid(), "j", chain(3), 0.0))
    t0 = sends(out)[0]
    (t1,) = sends(ok(s, t0))
    assert t1.task == "t1" and t1.node == "n1"
    s.handle(NodeUp(sid(), "n2", 1, 1.0))
    # n1 dies while t1 runs: t1 must re-run on n2, and t0's output (on n1) is recomputed first.
    out = s.handle(NodeDown(sid(), "n1", 2.0))
    s.validate_state()
    (redo,) = sends(out)
    assert redo.task == "t0" and redo.node == "n2" and redo.attempt == 1
    (t1b,) = sends(ok(s, redo, now=3.0))
    assert t1b.task == "t1" and t1b.attempt == 1
    (t2,) = sends(ok(s, t1b, now=4.0))
    assert finished(ok(s, t2, now=5.0))[0].state == "done"


def test_outputs_nobody_needs_are_not_recomputed() -> None:
    s = cluster("n1", "n2", slots=1)
    tasks = (TaskSpec("a", "full"), TaskSpec("b", "exp", ("a",)), TaskSpec("c", "full", is_output=True))
    by = {x.task: x for x in sends(s.handle(SubmitJob(sid(), "j", tasks, 0.0)))}
    out = ok(s, by["a"])
    by.update({x.task: x for x in sends(out)})
    ok(s, by["b"])
    # both done; now the node holding a dies: nothing needs a any more.
    s.handle(NodeDown(sid(), by["a"].node, 2.0))
    assert s.jobs["j"].tasks["a"].state == "done"
    s.validate_state()


def test_cancel_stops_everything() -> None:
    s = cluster("n1")
    s.handle(SubmitJob(sid(), "j", chain(3), 0.0))
    (fin,) = finished(s.handle(CancelJob(sid(), "j", 1.0)))
    assert fin.state == "cancelled"
    assert {t.state for t in s.tasks_of("j")} == {"cancelled"}
    assert not s.nodes["n1"].running
    s.validate_state()


def test_bad_submissions_and_transitions_are_refused() -> None:
    s = cluster("n1")
    with pytest.raises(ValueError, match="unknown task 'zz'"):
        s.handle(SubmitJob(sid(), "j", (TaskSpec("a", "exp", ("zz",)),), 0.0))
    s.handle(SubmitJob(sid(), "k", chain(2), 0.0))
    with pytest.raises(ValueError, match="already submitted"):
        s.handle(SubmitJob(sid(), "k", chain(1), 0.0))
    waiting = s.jobs["k"].tasks["t1"]
    assert waiting.state == "pending"
    with pytest.raises(InvalidTransition, match="pending -> done is not allowed"):
        s._move(waiting, "done", "x", 0.0, [])
    assert waiting.state == "pending"


@pytest.mark.parametrize("seed", range(40))
def test_random_chaos_always_ends_in_a_final_state(seed: int) -> None:
    """Random DAGs, lost packets, infra errors, progress acks of tasks that may never end
    (they drift at their run deadlines) and node deaths (one node always survives):
    every job ends done, and the invariants hold after every event. Odd seeds place the
    tasks (so some are sent early, behind their inputs, and recalled when those drift)."""
    rnd = random.Random(seed)
    s = cluster("n0", "n1", "n2", slots=2, policy=Policy(min_timeout_s=1.0, max_sends=2, max_attempts=50))
    n = rnd.randint(1, 12)
    deps = [tuple(f"t{d}" for d in rnd.sample(range(i), rnd.randint(0, min(i, 3)))) for i in range(n)]
    tasks = tuple(TaskSpec(f"t{i}", "op", deps[i], output_bytes=rnd.randint(1, 100), is_output=i == n - 1,
                           node=rnd.choice(["n0", "n1", "n2"]) if seed % 2 else None, priority=i)
                  for i in range(n))
    inflight: list[Send] = sends(s.handle(SubmitJob(sid(), "j", tasks, 0.0)))
    now, done = 0.0, []
    for _ in range(2000):
        now += 0.3
        r = rnd.random()
        if inflight and r < 0.6:
            snd = inflight.pop(rnd.randrange(len(inflight)))
            node = s.nodes[snd.node]
            task = s.jobs["j"].tasks[snd.task]
            if task.attempt == snd.attempt and task.waiting_on and node.alive:
                inflight.append(snd)  # sent early: the executor holds it until its inputs are made
                out = s.handle(Tick(sid(), now))
            elif not node.alive or rnd.random() < 0.2:
                out = []  # lost packet, or the node is gone
            elif rnd.random() < 0.3:  # still running there (its kernel may hang): a progress ack
                inflight.append(snd)
                out = s.handle(TaskAcked(sid(), "j", snd.task, snd.attempt, now,
                                         rnd.choice([None, now - rnd.random()])))
            elif rnd.random() < 0.1:
                out = s.handle(TaskErred(sid(), "j", snd.task, snd.attempt, snd.node, "infra", "x", now))
            else:
                out = s.handle(TaskSucceeded(sid(), "j", snd.task, snd.attempt, snd.node, now))
        elif r < 0.63 and sum(x.alive for x in s.nodes.values()) > 1:
            out = s.handle(NodeDown(sid(), rnd.choice(["n1", "n2"]), now))
        elif r < 0.7:
            out = s.handle(NodeUp(sid(), rnd.choice(["n1", "n2"]), 2, now))
        else:
            out = s.handle(Tick(sid(), now))
        s.validate_state()
        inflight.extend(sends(out))
        done.extend(finished(out))
        if done:
            break
    assert done == [JobFinished("j", "done")], f"seed {seed}: {done or 'job did not finish'}"


def small(i: int) -> TaskSpec:
    return TaskSpec(f"s{i}", "full", cost_s=1e-6, output_bytes=4)


def test_small_tasks_fill_more_slots_than_heavy_ones() -> None:
    s = cluster("n1", "n2", slots=2, policy=Policy(retry_backoff_s=0.0, small_slots=5))
    out = s.handle(SubmitJob(sid(), "j", tuple(small(i) for i in range(20)), 0.0))
    first = sends(out)
    assert len(first) == 10 and {x.node for x in first} == {"n1", "n2"}  # 5 per node, not 2
    s.validate_state()
    (one,) = sends(ok(s, first[0]))  # a freed slot takes the next small task
    assert one.task == "s10"
    # A task that is not small (big output) waits until fewer than `slots` run on a node,
    # and the small ones behind it wait too (oldest first).
    s2 = cluster("n1", slots=2, policy=Policy(retry_backoff_s=0.0, small_slots=5))
    big = TaskSpec("big", "full", cost_s=1e-6, output_bytes=1 << 20)
    out = s2.handle(SubmitJob(sid(), "j", (small(0), small(1), small(2), big, small(3)), 0.0))
    assert [x.task for x in sends(out)] == ["s0", "s1", "s2"]
    assert sends(ok(s2, sends(out)[0])) == []  # still 2 running: "big" does not fit yet
    assert [x.task for x in sends(ok(s2, sends(out)[1]))] == ["big", "s3"]


def test_small_slots_below_slots_change_nothing() -> None:
    s = cluster("n1", slots=3, policy=Policy(retry_backoff_s=0.0, small_slots=1))
    out = s.handle(SubmitJob(sid(), "j", tuple(small(i) for i in range(6)), 0.0))
    assert len(sends(out)) == 3
    s.validate_state()


def test_ready_tasks_go_in_the_plans_order_and_an_urgent_one_jumps_the_queue() -> None:
    # One node, one slot. The plan's predicted starts (priority) order the queue, not the
    # order in which tasks became ready: "late" depends on t0 and the plan runs it before
    # the two independent tasks, so once t0 is done it goes first although they waited longer.
    s = cluster("n1", slots=1)
    specs = (TaskSpec("t0", "exp", priority=0.0), TaskSpec("b", "exp", priority=0.5),
             TaskSpec("a", "exp", priority=0.3), TaskSpec("late", "exp", ("t0",), priority=0.1))
    out = s.handle(SubmitJob(sid(), "j", specs, 0.0))
    order = []
    while sends(out):
        (snd,) = sends(out)
        order.append(snd.task)
        out = ok(s, snd)
    assert order == ["t0", "late", "a", "b"]
    assert finished(out) == [JobFinished("j", "done")]


def test_an_earlier_job_goes_before_a_later_one_whatever_the_priorities() -> None:
    s = cluster("n1", slots=1)
    first = s.handle(SubmitJob(sid(), "j1", (TaskSpec("x0", "exp", priority=0.0),
                                             TaskSpec("x1", "exp", priority=9.0)), 0.0))
    s.handle(SubmitJob(sid(), "j2", (TaskSpec("y0", "exp", priority=0.0),), 0.0))
    order = [(snd := sends(first)[0]).job + "/" + snd.task]
    out = ok(s, snd)
    while sends(out):
        (snd,) = sends(out)
        order.append(f"{snd.job}/{snd.task}")
        out = ok(s, snd)
    assert order == ["j1/x0", "j1/x1", "j2/y0"]


def test_heavy_tasks_are_two_in_flight_per_node_lighter_ones_fill_the_slots() -> None:
    # An executor runs kernels one after another: a heavy task queued behind three others
    # would wait for all of them, so at most `heavy_slots` heavy tasks are in flight.
    s = cluster("n1", slots=4)
    heavy = tuple(TaskSpec(f"h{i}", "matmul", cost_s=0.1, output_bytes=1 << 20) for i in range(5))
    out = s.handle(SubmitJob(sid(), "j", heavy, 0.0))
    first = sends(out)
    assert [x.task for x in first] == ["h0", "h1"]
    s.validate_state()
    assert [x.task for x in sends(ok(s, first[0]))] == ["h2"]
    s2 = cluster("n1", slots=4)
    medium = tuple(TaskSpec(f"m{i}", "add", cost_s=0.002, output_bytes=1 << 20) for i in range(5))
    assert len(sends(s2.handle(SubmitJob(sid(), "j", medium, 0.0)))) == 4
    s2.validate_state()


def placed(tid: str, node: str, *deps: str, cost_s: float = 0.001) -> TaskSpec:
    return TaskSpec(tid, "op", deps, cost_s=cost_s, output_bytes=64, node=node, priority=int(tid[1:]))


def test_a_task_placed_with_its_input_is_sent_behind_it_and_told_to_wait_there() -> None:
    s = cluster("n1", "n2")
    out = s.handle(SubmitJob(sid(), "j", (placed("t0", "n1"), placed("t1", "n1", "t0"),
                                          placed("t2", "n2", "t1")), 0.0))
    s.validate_state()
    first, early = sends(out)
    assert (first.task, early.task) == ("t0", "t1") and early.node == "n1"
    assert early.pull_from == (("t0", "n1"),)  # made on its own node: the executor waits for it
    assert s.jobs["j"].tasks["t2"].state == "pending"  # placed on n2: it waits for the reply
    out = ok(s, first)
    assert sends(out) == []  # t1 is on its way already
    (last,) = sends(ok(s, early))
    assert last.task == "t2" and last.pull_from == (("t1", "n1"),)
    assert finished(ok(s, last)) == [JobFinished("j", "done")]


def test_early_sends_need_every_unfinished_input_on_the_node_and_the_policy() -> None:
    s = cluster("n1", "n2")
    out = s.handle(SubmitJob(sid(), "j", (placed("t0", "n1"), placed("t1", "n2"),
                                          placed("t2", "n1", "t0", "t1")), 0.0))
    by = {x.task: x for x in sends(out)}
    assert set(by) == {"t0", "t1"}  # t1 runs on n2: t2 waits for it
    (t2,) = sends(ok(s, by["t1"]))
    assert t2.node == "n1" and dict(t2.pull_from) == {"t0": "n1", "t1": "n2"}  # t0 still running
    off = cluster("n1", policy=Policy(retry_backoff_s=0.0, eager=False))
    out = off.handle(SubmitJob(sid(), "j", (placed("t0", "n1"), placed("t1", "n1", "t0")), 0.0))
    assert [x.task for x in sends(out)] == ["t0"]
    (t1,) = sends(ok(off, sends(out)[0]))
    assert t1.pull_from == ()  # done, and here: nothing to pull or wait for


def test_early_tasks_count_against_the_slots() -> None:
    s = cluster("n1", slots=4)
    heavy = [placed("t0", "n1", cost_s=0.1)]
    heavy += [placed(f"t{i}", "n1", f"t{i - 1}", cost_s=0.1) for i in (1, 2, 3)]
    out = s.handle(SubmitJob(sid(), "j", tuple(heavy), 0.0))
    assert [x.task for x in sends(out)] == ["t0", "t1"]  # two heavy ones in flight, as ever
    s.validate_state()
    assert [x.task for x in sends(ok(s, sends(out)[0]))] == ["t2"]


@pytest.mark.parametrize("slots", [2, 4])
def test_a_drifting_input_recalls_the_tasks_sent_early_behind_it(slots: int) -> None:
    # With 2 slots, t2 is ready (early) but not sent yet when t0 fails; with 4 it is sent.
    s = cluster("n1", "n2", slots=slots)
    out = s.handle(SubmitJob(sid(), "j", (placed("t0", "n1"), placed("t1", "n1", "t0"),
                                          placed("t2", "n1", "t1")), 0.0))
    sent = sends(out)  # a chain, each behind the one before it
    assert [x.task for x in sent] == ["t0", "t1", "t2"][:slots]
    out = s.handle(TaskErred(sid(), "j", "t0", 0, "n1", "infra", "disk on fire", 1.0))
    s.validate_state()
    tasks = s.jobs["j"].tasks
    assert tasks["t1"].attempt == 1 and tasks["t2"].attempt == (1 if slots > 2 else 0)  # recalled
    assert tasks["t1"].state == tasks["t2"].state == "pending" and not s.nodes["n1"].running
    (again,) = sends(out)
    assert again.task == "t0" and again.node == "n2" and again.attempt == 1  # n1 failed it
    # Stale replies of the recalled attempts change nothing.
    assert all(ok(s, x) == [] for x in sent[1:])
    t1, t2 = sends(ok(s, again))  # t1 where placed, t2 early behind it again
    assert t1.task == "t1" and t1.node == "n1" and t1.attempt == 1 and t1.pull_from == (("t0", "n2"),)
    assert t2.task == "t2" and t2.node == "n1" and t2.pull_from == (("t1", "n1"),)
    assert sends(ok(s, t1)) == []
    assert finished(ok(s, t2)) == [JobFinished("j", "done")]
