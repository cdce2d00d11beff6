"""Packet admission: drops by reason, duplicates, cached replies, ping (pure: no sockets)."""

from __future__ import annotations

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
)

SECRET = b"intake-unit-test-secret"
NOW = 1_750_000_000.0


def packet(task_id: str = "j1.n0.a0", deadline: float = NOW + 30, secret: bytes = SECRET) -> bytes:
    return encode_task(TaskPacket(task_id, "neg", ("x",), ("y",), deadline), secret)


def test_admit_then_duplicate_in_progress_then_cached_reply() -> None:
    intake = Intake(SECRET)
    first = intake.receive(packet(), now=NOW)
    assert isinstance(first, Admit) and first.task.task == "j1.n0.a0" and first.received == NOW
    assert intake.receive(packet(), now=NOW + 1) == InProgress("j1.n0.a0")
    intake.finished("j1.n0.a0", b"the reply")
    assert intake.receive(packet(), now=NOW + 2) == Resend(b"the reply")
    assert intake.counters.duplicate == 2
    assert isinstance(intake.receive(packet("j1.n0.a1"), now=NOW), Admit)  # next attempt is new


def test_bad_packets_are_counted_under_their_reason() -> None:
    intake = Intake(SECRET)
    cases = {
        "malformed": b"{{{ not yaml",
        "oversized": b"x" * 1473,
        "unsigned": b'{"attrs":{},"deadline":1.0,"from":{},"in":[],"op":"neg","out":["y"],'
                    b'"task":"j.t.a0","v":1}',
        "bad_signature": packet(secret=b"another-secret-of-16-bytes"),
        "stale": packet("j1.n5.a0", deadline=NOW - 11),
        "version": b'{"v":2,"sig":"' + b"0" * 64 + b'"}',
    }
    for reason, raw in cases.items():
        assert intake.receive(raw, now=NOW) == Drop(reason), reason
    assert {k: v for k, v in intake.counters.as_dict().items() if v} == dict.fromkeys(cases, 1)
    assert intake.receive(b"x" * 1473, now=NOW, max_bytes=65536) != Drop("oversized")  # TCP bound


def test_ping_gets_a_signed_pong_and_replies_are_ignored() -> None:
    intake = Intake(SECRET)
    action = intake.receive(encode_control(Control("ping", "nonce-1", NOW), SECRET), now=NOW)
    assert isinstance(action, Respond)
    pong = decode_control(action.data, SECRET, now=NOW)
    assert (pong.kind, pong.id) == ("pong", "nonce-1")
    reply = encode_reply(Reply("j1.n0.a0", True, Timings(NOW, NOW, NOW)), SECRET)
    assert intake.receive(reply, now=NOW) == Drop("ignored")
    assert intake.counters.total == 0 and intake.ignored == 1


def test_ack_is_a_signed_control_message() -> None:
    ack = decode_control(Intake(SECRET).ack("j1.n0.a0", now=NOW), SECRET, now=NOW)
    assert (ack.kind, ack.id) == ("ack", "j1.n0.a0")
