"""The metrics' counters, fed the pure dispatcher's own transitions: dispatched, succeeded
and drifted by op and node, the queue depth, the latencies, a job's last step counted
although the job left the state first."""

from __future__ import annotations

from triplane.scheduler.dispatch.state import (
    DispatchState,
    JobFinished,
    NodeDown,
    NodeUp,
    SubmitJob,
    TaskSpec,
    TaskSucceeded,
    Transitioned,
)
from triplane.scheduler.metrics import Counts


def feed(st: DispatchState, c: Counts, event: object) -> list[object]:
    """What the shell does: the end of a job first (it then leaves the state), then the
    step's transitions in one batch."""
    out = st.handle(event)  # type: ignore[arg-type]
    for ins in out:
        if isinstance(ins, JobFinished):
            c.finished(ins)
            del st.jobs[ins.job]
    c.transitions([ins for ins in out if isinstance(ins, Transitioned)])
    return out


def test_counts_follow_the_dispatcher() -> None:
    st = DispatchState(None)
    c = Counts(lambda: st)
    feed(st, c, NodeUp("up:a", "a", 1, 0.0))
    specs = (TaskSpec("t0", "exp"), TaskSpec("t1", "exp"), TaskSpec("t2", "add", deps=("t0", "t1")))
    feed(st, c, SubmitJob("s", "j", specs, 1.0))
    # one slot on "a": one exp sent, the other waits ready
    assert c.tasks == {("dispatched", "exp", "a"): 1} and c.queued == 1
    feed(st, c, NodeUp("up:b", "b", 1, 1.5))
    feed(st, c, NodeDown("down:a", "a", 2.0))  # the task sent to a drifts to b
    assert c.tasks["drifted", "exp", "a"] == 1
    step = 0
    while "j" in st.jobs:  # answer whatever runs until the job is done
        step += 1
        assert step < 10
        running = [(t, r) for t, r in st.jobs["j"].tasks.items() if r.state == "dispatched"]
        for t, r in running:
            feed(st, c, TaskSucceeded(f"ok{step}{t}", "j", t, r.attempt, r.node, 3.0 + step))
    assert "j" not in st.jobs  # done, and its last transition was counted all the same
    assert c.tasks["succeeded", "exp", "b"] == 2 and c.tasks["succeeded", "add", "b"] == 1
    assert sum(n for (w, _, _), n in c.tasks.items() if w == "dispatched") == 4  # 3 tasks + 1 drift
    assert c.queued == 0
    assert sum(c.task_latency.counts) == 3 and sum(c.dispatch_latency.counts) == 4
