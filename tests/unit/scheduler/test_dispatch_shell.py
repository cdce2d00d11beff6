"""The dispatcher's I/O shell reads structured reply errors and progress acks (no sockets:
the shell is not started, so its sends are only counted as unsendable)."""

from __future__ import annotations

from triplane.proto.packet import Control, Reply, TaskError, Timings
from triplane.registry import NodeInfo
from triplane.scheduler.dispatch.shell import DispatchShell
from triplane.scheduler.dispatch.state import DispatchState, Policy, SubmitJob, TaskSpec

SECRET = b"s" * 32


def shell_with_one_task() -> tuple[DispatchShell, str]:
    shell = DispatchShell(DispatchState(Policy(retry_backoff_s=0.0)), SECRET, templates={})
    for i, n in enumerate(("a", "b", "c")):
        shell.node_up(NodeInfo(n, "127.0.0.1", 9000 + i, 9000 + i, 9100 + i, "0.1.0", 0.0, 1))
    shell.handle(SubmitJob("sub", "j", (TaskSpec("t", "neg", node="a"),), 0.0))
    t = shell.state.jobs["j"].tasks["t"]
    assert t.state == "dispatched" and t.node == "a"
    return shell, "j.t.a0"


def failed(task_id: str, error: TaskError) -> Reply:
    return Reply(task_id, False, Timings(1.0, 1.0, 1.0), (), error)


def test_a_failed_pull_makes_the_node_its_structured_error_names_suspect() -> None:
    shell, tid = shell_with_one_task()
    shell._on_reply(failed(tid, TaskError("infra", "(any text)", node="c", input="j.x")))
    assert "c" in shell._suspects and not shell.state.nodes["c"].alive
    t = shell.state.jobs["j"].tasks["t"]
    assert t.attempt == 1 and "a" in t.excluded  # drifted off the node that replied


def test_the_message_text_is_never_parsed() -> None:
    shell, tid = shell_with_one_task()
    # The old wording, without the structured fields: no node is suspected for it.
    shell._on_reply(failed(tid, TaskError("infra", "pulling input j.x from node c failed: no", node="a")))
    assert not shell._suspects and shell.state.nodes["c"].alive


def test_an_ack_with_since_reaches_the_state_machine_as_progress() -> None:
    shell, tid = shell_with_one_task()
    t = shell.state.jobs["j"].tasks["t"]
    due = t.due
    shell._on_control(Control("ack", tid, 1.0, since=0.5), ("127.0.0.1", 9000))
    assert t.started and t.due >= due


def test_a_reply_sends_the_next_task_before_its_bookkeeping() -> None:
    """The successor's packet goes out first; then the output hook, then the end of the job
    and the transitions batch (the journal needs the output before the done transition)."""
    from triplane.scheduler.compiler.jobplan import TaskTemplate
    from triplane.scheduler.dispatch.shell import Hooks

    order: list[str] = []

    class Udp:
        def sendto(self, data: bytes, addr: object) -> None:
            order.append("send")

    templates = {"j": {t: TaskTemplate("neg", (), (), {}, None) for t in ("t0", "t1")}}  # type: ignore[arg-type]
    hooks = Hooks(finished=lambda f: order.append("finished"),
                  transitions=lambda ts: order.append("transitions:" + ",".join(t.finish for t in ts)),
                  output=lambda job, task, node, r: order.append(f"output:{task}"),
                  sending=lambda s: order.append(f"sending:{s.task}"))
    shell = DispatchShell(DispatchState(), SECRET, templates, hooks)
    shell._udp = Udp()  # type: ignore[assignment]
    shell.node_up(NodeInfo("a", "127.0.0.1", 9000, 9000, 9100, "0.1.0", 0.0, 1))
    shell.handle(SubmitJob("sub", "j", (TaskSpec("t0", "neg"), TaskSpec("t1", "neg", ("t0",))), 0.0))
    order.clear()
    ok = Reply("j.t0.a0", True, Timings(1.0, 1.0, 1.0), ())
    shell._on_reply(ok)
    assert order == ["send", "sending:t1", "output:t0", "transitions:done,ready,dispatched"]
    order.clear()
    shell._on_reply(ok)  # a duplicate: recorded once
    assert order == []
    shell._on_reply(Reply("j.t1.a0", True, Timings(1.0, 1.0, 1.0), ()))
    assert order == ["output:t1", "finished", "transitions:done"]
