"""Deadlines in the dispatcher's pure state machine (no sockets): an attempt's run deadline,
which acknowledgements do not move, the kernel-start report that moves it once, the
doubling budget after an overrun, a job's own deadline, and structured failures."""

from __future__ import annotations

import pytest

from triplane.proto.states import TaskState
from triplane.scheduler.dispatch.state import (
    DispatchState,
    JobFinished,
    NodeUp,
    Policy,
    Send,
    SubmitJob,
    TaskAcked,
    TaskErred,
    TaskFailure,
    TaskSpec,
    TaskSucceeded,
    Tick,
)

# A run budget of 2 s + 10 x the predicted 0.1 s = 3 s; resend after 1 s without an ack.
POLICY = Policy(run_slack_s=2.0, deadline_factor=10.0, min_timeout_s=1.0, max_sends=3, retry_backoff_s=0.0)


def sends(out: list) -> list[Send]:
    return [i for i in out if isinstance(i, Send)]


def finished(out: list) -> list[JobFinished]:
    return [i for i in out if isinstance(i, JobFinished)]


def two_nodes(policy: Policy = POLICY) -> DispatchState:
    s = DispatchState(policy)
    s.handle(NodeUp("up-a", "a", 2, 0.0))
    s.handle(NodeUp("up-b", "b", 2, 0.0))
    return s


def one_task(s: DispatchState, job: str = "j", deadline: float | None = None, now: float = 0.0) -> Send:
    (send,) = sends(s.handle(SubmitJob(f"sub-{job}", job, (TaskSpec("t", "matmul", cost_s=0.1),), now,
                                       deadline=deadline)))
    return send


def keep_acking(s: DispatchState, send: Send, until: float, since: float | None = None,
                step: float = 0.25) -> list:
    """Tick every ``step`` seconds and answer every (re)send with an ack, as a live executor
    running the task does; returns everything the state machine said."""
    out: list = []
    now = 0.0
    while now < until:
        now = round(now + step, 6)
        got = s.handle(Tick(f"tick{now}", now))
        out += got
        for x in sends(got):
            if x.attempt == send.attempt and x.node == send.node:
                s.handle(TaskAcked(f"ack{now}", x.job, x.task, x.attempt, now, since))
        s.validate_state()
    return out


def test_the_run_deadline_is_the_packets_deadline() -> None:
    s = two_nodes()
    send = one_task(s)
    assert send.deadline == pytest.approx(3.0)
    assert s.jobs["j"].tasks["t"].due == pytest.approx(3.0)


def test_a_hung_kernel_that_keeps_acknowledging_drifts_at_its_run_deadline() -> None:
    s = two_nodes()
    send = one_task(s)
    s.handle(TaskAcked("ack0", "j", "t", 0, 0.1))
    before = keep_acking(s, send, until=2.75)
    assert not [x for x in sends(before) if x.attempt == 1]  # acked and within 3 s: stays
    t = s.jobs["j"].tasks["t"]
    assert t.state == TaskState.DISPATCHED and t.attempt == 0
    after = keep_acking(s, send, until=3.25)
    (moved,) = [x for x in sends(after) if x.attempt == 1]
    assert moved.node != send.node and not moved.resend
    assert [(r.start, r.finish) for r in t.log][-2:] == [("dispatched", "ready"), ("ready", "dispatched")]
    assert t.overruns == 1
    # The late reply of the hung attempt changes nothing; the new attempt's result counts.
    assert s.handle(TaskSucceeded("late", "j", "t", 0, send.node, 9.0)) == []
    assert finished(s.handle(TaskSucceeded("r1", "j", "t", 1, moved.node, 9.5))) == [JobFinished("j", "done")]
    s.validate_state()


def test_acks_without_a_kernel_start_never_move_the_run_deadline() -> None:
    s = two_nodes()
    send = one_task(s)
    for i in range(20):  # an ack storm: each one only postpones retransmission
        s.handle(TaskAcked(f"ack{i}", "j", "t", 0, 0.1 * i))
    assert s.jobs["j"].tasks["t"].due == pytest.approx(3.0)
    out = s.handle(Tick("late", 3.0))
    assert [x.attempt for x in sends(out)] == [1] and sends(out)[0].node != send.node


def test_a_reported_kernel_start_moves_the_run_deadline_once() -> None:
    s = two_nodes()
    send = one_task(s)
    t = s.jobs["j"].tasks["t"]
    # Queued on the executor for 1.5 s, then its kernel started: the budget counts from then.
    s.handle(TaskAcked("ack1", "j", "t", 0, 1.6, since=1.5))
    assert t.due == pytest.approx(4.5)
    # Later progress reports (even a different start) do not move it again.
    s.handle(TaskAcked("ack2", "j", "t", 0, 2.6, since=2.5))
    s.handle(TaskAcked("ack3", "j", "t", 0, 3.6, since=1.5))
    assert t.due == pytest.approx(4.5)
    # A start reported in the future (clock skew) counts as now.
    s2 = two_nodes()
    one_task(s2)
    s2.handle(TaskAcked("ack", "j", "t", 0, 1.0, since=50.0))
    assert s2.jobs["j"].tasks["t"].due == pytest.approx(4.0)
    assert not [x for x in sends(s.handle(Tick("before", 4.4))) if x.attempt == 1]
    assert t.attempt == 0 and t.state == TaskState.DISPATCHED
    (moved,) = [x for x in sends(s.handle(Tick("past", 4.5))) if x.attempt == 1]
    assert moved.node != send.node
    s.validate_state()


def test_each_overrun_doubles_the_next_attempts_budget_and_attempts_stay_bounded() -> None:
    s = two_nodes(Policy(run_slack_s=2.0, deadline_factor=10.0, min_timeout_s=100.0, max_attempts=3,
                         retry_backoff_s=0.0))
    first = one_task(s)
    assert first.deadline == pytest.approx(3.0)
    (second,) = sends(s.handle(Tick("t1", 3.0)))
    assert second.attempt == 1 and second.deadline == pytest.approx(3.0 + 6.0)
    (third,) = sends(s.handle(Tick("t2", 9.0)))
    assert third.attempt == 2 and third.deadline == pytest.approx(9.0 + 12.0)
    (fin,) = finished(s.handle(Tick("t3", 21.0)))
    assert fin.state == "failed" and fin.error is not None
    assert (fin.error.kind, fin.error.task, fin.error.op, fin.error.attempts) == ("infra", "t", "matmul", 3)
    assert "run deadline" in fin.error.message and fin.error.node == third.node
    s.validate_state()


def test_a_job_deadline_fails_the_job_with_kind_deadline() -> None:
    s = two_nodes()
    one_task(s, deadline=2.0)
    assert finished(s.handle(Tick("t1", 1.9))) == []
    out = s.handle(Tick("t2", 2.0))
    (fin,) = finished(out)
    assert fin.state == "failed" and fin.error is not None
    assert fin.error.kind == "deadline" and fin.error.task is None
    assert "deadline" in fin.error.message and "0 of 1 tasks done" in fin.error.message
    assert s.jobs["j"].tasks["t"].state == TaskState.CANCELLED
    assert not any(n.running for n in s.nodes.values())  # its slots are free again
    s.validate_state()


def test_a_job_done_before_its_deadline_is_not_failed_later() -> None:
    s = two_nodes()
    send = one_task(s, deadline=5.0)
    assert finished(s.handle(TaskSucceeded("ok", "j", "t", 0, send.node, 1.0))) == [JobFinished("j", "done")]
    assert finished(s.handle(Tick("later", 6.0))) == []
    assert s.jobs["j"].state == "done"


def test_job_deadlines_are_checked_in_order_and_only_for_their_jobs() -> None:
    s = two_nodes()
    one_task(s, "early", deadline=2.0)
    one_task(s, "late", deadline=4.0)
    one_task(s, "none")
    assert [f.job for f in finished(s.handle(Tick("t1", 3.0)))] == ["early"]
    assert [f.job for f in finished(s.handle(Tick("t2", 4.0)))] == ["late"]
    assert s.jobs["none"].state == "running"


def test_a_failed_pull_is_kept_as_data_to_the_jobs_error() -> None:
    s = two_nodes(Policy(max_attempts=1, retry_backoff_s=0.0))
    send = one_task(s)
    (fin,) = finished(s.handle(TaskErred("e", "j", "t", 0, send.node, "infra", "pulling input x failed",
                                         1.0, input="j.x", input_node="c")))
    assert fin.error == TaskFailure("infra", "infra error on " + send.node + ": pulling input x failed; "
                                    "gave up after 1 attempts", "t", "matmul", "c", "j.x", 1)
