"""State-machine additions the scheduler service needs: acks, resumed jobs, O(placed) scheduling."""

from __future__ import annotations

import gc
import time

from triplane.scheduler.dispatch.state import (
    DispatchState,
    NodeDown,
    NodeUp,
    Policy,
    Send,
    SubmitJob,
    TaskAcked,
    TaskSpec,
    TaskSucceeded,
    Tick,
)


def sends(out: list) -> list[Send]:
    return [i for i in out if isinstance(i, Send)]


def test_ack_postpones_the_retransmission_until_the_run_time_passes() -> None:
    s = DispatchState(Policy(min_timeout_s=1.0))
    s.handle(NodeUp("up", "a", 1, 0.0))
    (send,) = sends(s.handle(SubmitJob("sub", "j", (TaskSpec("t", "exp"),), 0.0)))
    assert send.deadline == 5.0 + 10 * 0.001  # the run deadline: slack + factor x predicted
    s.handle(TaskAcked("ack", "j", "t", 0, 0.9))
    assert sends(s.handle(Tick("tick1", 1.5))) == []  # without the ack this tick resends
    (resend,) = sends(s.handle(Tick("tick2", 1.95)))
    assert resend.resend and resend.attempt == 0
    s.validate_state()


def test_a_slow_task_that_keeps_acking_does_not_drift_before_its_run_deadline() -> None:
    s = DispatchState(Policy(min_timeout_s=1.0, max_sends=2, retry_backoff_s=0.0))
    s.handle(NodeUp("up", "a", 1, 0.0))
    s.handle(NodeUp("up-b", "b", 1, 0.0))
    (send,) = [
        x for x in sends(s.handle(SubmitJob("sub", "j", (TaskSpec("t", "exp"),), 0.0))) if x.task == "t"
    ]
    now = 0.0
    for i in range(4):  # each retransmission is answered by an ack: still running (4.04 s < 5.01)
        now += 1.01
        out = s.handle(Tick(f"tick{i}", now))
        assert all(x.attempt == 0 and x.node == send.node for x in sends(out))
        s.handle(TaskAcked(f"ack{i}", "j", "t", 0, now))
    assert s.jobs["j"].tasks["t"].attempt == 0 and s.jobs["j"].tasks["t"].state == "dispatched"
    s.validate_state()


def test_without_acks_the_task_drifts_after_max_sends() -> None:
    s = DispatchState(Policy(min_timeout_s=1.0, max_sends=2, retry_backoff_s=0.0))
    s.handle(NodeUp("up", "a", 1, 0.0))
    s.handle(NodeUp("up-b", "b", 1, 0.0))
    (first,) = sends(s.handle(SubmitJob("sub", "j", (TaskSpec("t", "exp"),), 0.0)))
    s.handle(Tick("t1", 1.0))
    (moved,) = sends(s.handle(Tick("t2", 2.0)))
    assert moved.attempt == 1 and moved.node != first.node


def test_ack_of_a_stale_attempt_changes_nothing() -> None:
    s = DispatchState(Policy(min_timeout_s=1.0))
    s.handle(NodeUp("up", "a", 1, 0.0))
    s.handle(SubmitJob("sub", "j", (TaskSpec("t", "exp"),), 0.0))
    s.handle(TaskAcked("ack", "j", "t", 5, 0.9))
    assert sends(s.handle(Tick("tick", 1.0)))[0].resend


def test_resumed_job_starts_with_its_done_tasks_and_pulls_from_their_node() -> None:
    s = DispatchState()
    for n in ("a", "b"):
        s.handle(NodeUp(f"up-{n}", n, 2, 0.0))
    specs = (
        TaskSpec("t0", "exp"),
        TaskSpec("t1", "exp", ("t0",)),
        TaskSpec("t2", "exp", ("t1",), is_output=True),
    )
    out = s.handle(SubmitJob("sub", "j", specs, 0.0, done=(("t0", "b"),)))
    (send,) = sends(out)
    assert send.task == "t1" and send.node == "b" and send.pull_from == ()  # placed near its input
    assert s.jobs["j"].remaining == 2
    s.validate_state()
    # The node holding the resumed output dies before t1 replies: t0 is recomputed (lineage).
    out = s.handle(NodeDown("down", "b", 1.0))
    assert {x.task for x in sends(out)} == {"t0"}
    s.validate_state()


def test_fully_done_resumed_job_finishes_at_once() -> None:
    s = DispatchState()
    s.handle(NodeUp("up", "a", 2, 0.0))
    out = s.handle(SubmitJob("sub", "j", (TaskSpec("t0", "exp", is_output=True),), 0.0, done=(("t0", "a"),)))
    assert s.jobs["j"].state == "done" and not sends(out)


def _run_ready_tasks(n_tasks: int) -> float:
    """Seconds the state machine takes to place and finish ``n_tasks`` independent tasks
    (the cyclic GC off while it runs: its passes cost by what earlier tests left alive)."""
    gc.collect()
    gc.disable()
    try:
        return _timed_ready_tasks(n_tasks)
    finally:
        gc.enable()


def _timed_ready_tasks(n_tasks: int) -> float:
    s = DispatchState()
    for n in ("a", "b"):
        s.handle(NodeUp(f"up-{n}", n, 2, 0.0))
    start = time.perf_counter()
    pending = sends(
        s.handle(SubmitJob("sub", "j", tuple(TaskSpec(f"t{i}", "noop") for i in range(n_tasks)), 0.0))
    )
    assert len(pending) == 4
    done = 0
    while pending:
        x = pending.pop()
        pending += sends(s.handle(TaskSucceeded(f"r{done}", x.job, x.task, x.attempt, x.node, 1.0)))
        done += 1
    elapsed = time.perf_counter() - start
    assert done == n_tasks and s.jobs["j"].state == "done"
    return elapsed


def test_ten_thousand_ready_tasks_cost_per_placement_not_per_queue_length() -> None:
    # Before: every event rescanned the whole ready queue -> 10k x 10k steps (minutes). The
    # cost is compared across sizes, not against a clock, so a loaded machine cannot fail it:
    # 5x the tasks costs about 5x (linear), where a rescan per event would cost 25x.
    small = min(_run_ready_tasks(2_000) for _ in range(2))
    large = min(_run_ready_tasks(10_000) for _ in range(2))
    assert large < 12 * small, f"10,000 tasks took {large / small:.1f}x the time of 2,000"


def test_tick_only_checks_tasks_in_flight() -> None:
    s = DispatchState(Policy(min_timeout_s=1.0))
    s.handle(NodeUp("up", "a", 1, 0.0))
    s.handle(SubmitJob("sub", "j", tuple(TaskSpec(f"t{i}", "noop") for i in range(3)), 0.0))
    out = s.handle(Tick("tick", 1.0))
    assert [(x.task, x.resend) for x in sends(out)] == [("t0", True)]  # the others never left
