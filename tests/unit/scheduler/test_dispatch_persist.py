"""A persisted job's done tasks outlive their node: readers read the persistence target
(the holder becomes ``store:<kind>``) instead of computing them again."""

from __future__ import annotations

from test_dispatch_state import chain, cluster, ok, sends, sid

from triplane.scheduler.dispatch.state import NodeDown, NodeUp, SubmitJob, Transitioned


def test_a_persisted_jobs_lost_output_is_read_from_the_target_not_recomputed() -> None:
    s = cluster("n1", "n2", slots=1)
    s.handle(NodeDown(sid(), "n2", 0.0))  # everything starts on n1
    out = s.handle(SubmitJob(sid(), "j", chain(3), 0.0, persist="file"))
    (t1,) = sends(ok(s, sends(out)[0]))
    assert t1.task == "t1" and t1.node == "n1"
    s.handle(NodeUp(sid(), "n2", 1, 1.0))
    out = s.handle(NodeDown(sid(), "n1", 2.0))  # n1 dies while t1 runs
    s.validate_state()
    (redo,) = sends(out)
    assert redo.task == "t1" and redo.node == "n2"  # t1 drifts; t0 is not run again
    assert dict(redo.pull_from) == {"t0": "store:file"}
    rehomed = [i for i in out if isinstance(i, Transitioned) and i.start == i.finish == "done"]
    assert [(i.task, i.node, i.stimulus_id) for i in rehomed] == [("t0", "store:file", "persisted:n1")]
    assert s.jobs["j"].tasks["t0"].attempt == 0
    (t2,) = sends(ok(s, redo, now=3.0))
    assert t2.task == "t2"


def test_without_persist_the_same_loss_recomputes() -> None:
    s = cluster("n1", "n2", slots=1)
    s.handle(NodeDown(sid(), "n2", 0.0))
    out = s.handle(SubmitJob(sid(), "j", chain(3), 0.0))
    ok(s, sends(out)[0])
    s.handle(NodeUp(sid(), "n2", 1, 1.0))
    (redo,) = sends(s.handle(NodeDown(sid(), "n1", 2.0)))
    assert redo.task == "t0" and redo.attempt == 1
