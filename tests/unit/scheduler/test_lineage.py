"""Lineage recompute's pure parts: which tasks a lost result needs run again, and a done
job dispatched again with new attempt numbers for those (so no executor answers the run
from its replay memory)."""

from __future__ import annotations

from triplane.scheduler.dispatch.state import (
    DispatchState,
    JobFinished,
    NodeUp,
    Policy,
    Send,
    SubmitJob,
    TaskSpec,
    TaskSucceeded,
)
from triplane.scheduler.lineage import needed_tasks

# a -> b -> d, a -> c -> d, and e (another result) from a; b and d are fetched
SPECS = (TaskSpec("a", "exp"), TaskSpec("b", "exp", ("a",), is_output=True), TaskSpec("c", "exp", ("a",)),
         TaskSpec("d", "add", ("b", "c"), is_output=True), TaskSpec("e", "exp", ("a",), is_output=True))


def test_a_lost_result_needs_the_inputs_that_are_not_available_and_nothing_else() -> None:
    kept = {"b", "e"}  # fetched results whose holders live; the intermediates were freed
    assert needed_tasks(SPECS, ["d"], kept.__contains__) == {"d", "c", "a"}
    assert needed_tasks(SPECS, ["d"], {"b", "c"}.__contains__) == {"d"}
    assert needed_tasks(SPECS, ["b", "e"], set().__contains__) == {"a", "b", "e"}
    assert needed_tasks(SPECS, [], set().__contains__) == set()


def test_a_done_job_dispatched_again_runs_only_those_tasks_with_the_attempts_given() -> None:
    s = DispatchState(Policy(retry_backoff_s=0.0))
    s.handle(NodeUp("up", "n1", 4, 0.0))
    done = (("b", "n1"), ("e", "n1"))  # kept results: where they are; the rest run again
    out = s.handle(SubmitJob("recompute:j", "j", SPECS, 1.0, done, attempts=(("a", 1), ("c", 1), ("d", 2))))
    sent = [i for i in out if isinstance(i, Send)]
    assert [(x.task, x.attempt) for x in sent] == [("a", 1)]
    out = s.handle(TaskSucceeded("r1", "j", "a", 1, "n1", 2.0))
    assert [(x.task, x.attempt) for x in out if isinstance(x, Send)] == [("c", 1)]
    out = s.handle(TaskSucceeded("r2", "j", "c", 1, "n1", 3.0))
    assert [(x.task, x.attempt) for x in out if isinstance(x, Send)] == [("d", 2)]
    assert s.handle(TaskSucceeded("stale", "j", "d", 0, "n1", 4.0)) == []  # the first run's reply
    out = s.handle(TaskSucceeded("r3", "j", "d", 2, "n1", 4.0))
    assert [(f.job, f.state) for f in out if isinstance(f, JobFinished)] == [("j", "done")]
    s.validate_state()
