"""Packet admission: drops by reason, duplicates, cached replies, ping, destination and
restart replays (pure: no sockets)."""

from __future__ import annotations

import logging

import pytest

from triplane.executor.intake import Admit, Drop, InProgress, Intake, Resend, Respond
from triplane.proto.packet import (
    Control,
    Reply,
    TaskPacket,
    Timings,
    decode_control,
    encode_control,
    encode_reply,
    encode_task,
    sign,
)

SECRET = b"intake-unit-test-secret"
NOW = 1_750_000_000.0


NODE = "n1"


def packet(task_id: str = "j1.n0.a0", deadline: float = NOW + 30, secret: bytes = SECRET, to: str = NODE,
           t: float = NOW) -> bytes:
    return encode_task(TaskPacket(task_id, "neg", ("x",), ("y",), deadline, {}, {}, to, t), secret)


def signed(body: bytes) -> bytes:
    """``body`` (ending in ``}``) with a valid ``sig`` member: bytes that pass the signature
    check, so what follows it is exercised."""
    return body[:-1] + b',"sig":"' + sign(body, SECRET).encode() + b'"}'


def test_admit_then_duplicate_in_progress_then_cached_reply() -> None:
    intake = Intake(SECRET, NODE)
    first = intake.receive(packet(), now=NOW)
    assert isinstance(first, Admit) and first.task.task == "j1.n0.a0" and first.received == NOW
    assert intake.receive(packet(), now=NOW + 1) == InProgress("j1.n0.a0")
    intake.finished("j1.n0.a0", b"the reply")
    assert intake.receive(packet(), now=NOW + 2) == Resend(b"the reply")
    assert intake.counters.duplicate == 2
    assert isinstance(intake.receive(packet("j1.n0.a1"), now=NOW), Admit)  # next attempt is new


def test_bad_packets_are_counted_under_their_reason() -> None:
    intake = Intake(SECRET, NODE)
    cases = {
        "malformed": signed(b'{"a":[1,2}'),
        "version": signed(b'{"v":1}'),
        "oversized": b"x" * 1473,
        "unsigned": b'{"attrs":{},"deadline":1.0,"from":{},"in":[],"op":"neg","out":["y"],'
                    b'"task":"j.t.a0","v":2}',
        "bad_signature": packet(secret=b"another-secret-of-16-bytes"),
        "stale": packet("j1.n5.a0", deadline=NOW - 11),
        "misaddressed": packet("j1.n6.a0", to="n2"),
    }
    for reason, raw in cases.items():
        assert intake.receive(raw, now=NOW) == Drop(reason), reason
    assert {k: v for k, v in intake.counters.as_dict().items() if v} == dict.fromkeys(cases, 1)
    assert intake.receive(b"x" * 1473, now=NOW, max_bytes=65536) != Drop("oversized")  # TCP bound


def test_ping_gets_a_signed_pong_and_replies_are_ignored() -> None:
    intake = Intake(SECRET, NODE)
    action = intake.receive(encode_control(Control("ping", "nonce-1", NOW), SECRET), now=NOW)
    assert isinstance(action, Respond)
    pong = decode_control(action.data, SECRET, now=NOW)
    assert (pong.kind, pong.id) == ("pong", "nonce-1")
    reply = encode_reply(Reply("j1.n0.a0", True, Timings(NOW, NOW, NOW)), SECRET)
    assert intake.receive(reply, now=NOW) == Drop("ignored")
    assert intake.counters.total == 0 and intake.ignored == 1


def test_ack_is_a_signed_control_message() -> None:
    ack = decode_control(Intake(SECRET, NODE).ack("j1.n0.a0", now=NOW), SECRET, now=NOW)
    assert (ack.kind, ack.id) == ("ack", "j1.n0.a0")


def test_a_packet_for_another_node_is_refused_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    intake = Intake(SECRET, "node-b")
    with caplog.at_level(logging.WARNING, logger="triplane.executor.intake"):
        for i in range(3):
            assert intake.receive(packet(f"j1.n{i}.a0", to="node-a"), now=NOW) == Drop("misaddressed")
    assert intake.counters.misaddressed == 3 and len(intake.replay) == 0
    assert [r.getMessage() for r in caplog.records if "node-a" in r.getMessage()] != []
    assert len(caplog.records) == 1
    assert isinstance(intake.receive(packet("j1.n9.a0", to="node-b"), now=NOW), Admit)


def test_tasks_sent_before_the_executor_started_are_refused() -> None:
    # A restarted executor has forgotten which tasks it ran: a packet recorded before its
    # start must not run again, although its deadline is still ahead.
    intake = Intake(SECRET, NODE, not_before=NOW)
    assert intake.receive(packet("j1.n0.a0", t=NOW - 5), now=NOW + 1) == Drop("stale")
    assert isinstance(intake.receive(packet("j1.n0.a0", t=NOW + 1), now=NOW + 1), Admit)


def test_a_task_is_stale_long_after_it_was_sent_whatever_its_deadline() -> None:
    intake = Intake(SECRET, NODE)
    assert intake.receive(packet(deadline=NOW + 3600, t=NOW - 31), now=NOW) == Drop("stale")
