"""What the executor does with received bytes, decided without I/O (STYLE.md 8).

``Intake.receive(data, ...)`` checks one datagram or TCP frame and returns one action:

* ``Admit(task)``: a new task to run (its id is now remembered by the ``ReplayGuard``);
* ``Resend(data)``: a duplicate of a task already answered -- send the cached reply again
  (the scheduler was probably retransmitting because our reply was lost);
* ``InProgress(task_id)``: a duplicate of a task still running -- the shell re-sends an
  ``ack`` so the scheduler stops retransmitting (the spec allows dropping it; an ack is
  cheaper than another retransmission round);
* ``Respond(data)``: a control message that wants an answer (``ping`` -> ``pong``);
* ``Drop(reason)``: refused and counted in ``counters`` under ``reason`` (or, for messages
  that are valid but not for an executor -- replies, acks, pongs -- ignored uncounted).

A task is refused (``misaddressed``) when its ``to`` names another node, and (``stale``)
when it was sent before ``not_before`` -- the executor's start: its replay memory begins
then, so a packet recorded for an earlier run of this node cannot run again.

``finished(task_id, reply)`` remembers the encoded reply for later duplicates. Nothing
here raises on bad bytes.
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

from triplane.proto.packet import (
    DEFAULT_GRACE,
    MAX_DATAGRAM_BYTES,
    Control,
    DropCounters,
    PacketError,
    ReplayGuard,
    Reply,
    TaskPacket,
    decode,
    encode_control,
)

__all__ = ["Admit", "Drop", "InProgress", "Intake", "Resend", "Respond"]

log = logging.getLogger(__name__)


class Admit(NamedTuple):
    task: TaskPacket
    received: float


class Resend(NamedTuple):
    data: bytes


class InProgress(NamedTuple):
    task_id: str


class Respond(NamedTuple):
    data: bytes


class Drop(NamedTuple):
    reason: str


Action = Admit | Resend | InProgress | Respond | Drop


class Intake:
    """Packet admission for executor ``node``: signature, freshness, destination and replay
    checks."""

    def __init__(self, secret: bytes, node: str, *, grace: float = DEFAULT_GRACE,
                 replay_capacity: int = 65536, not_before: float = -math.inf) -> None:
        self.secret = secret
        self.node = node
        self.grace = grace
        self.not_before = not_before
        self.counters = DropCounters()
        self.replay = ReplayGuard(replay_capacity)
        self.ignored = 0
        self._warned: set[str] = set()

    def receive(self, data: bytes, *, now: float | None = None,
                max_bytes: int = MAX_DATAGRAM_BYTES) -> Action:
        now = time.time() if now is None else now
        try:
            msg = decode(data, self.secret, now=now, max_bytes=max_bytes, grace=self.grace)
        except PacketError as e:
            self.counters.count(e)
            return Drop(e.reason)
        if isinstance(msg, TaskPacket):
            if msg.to != self.node:
                self.counters.misaddressed += 1
                self._warn_once("misaddressed", "dropped task %s: it is for node %r, this is %r "
                                "(logged once; counted as drops.misaddressed)", msg.task, msg.to, self.node)
                return Drop("misaddressed")
            if msg.t < self.not_before:
                self.counters.stale += 1
                self._warn_once("before_start", "dropped task %s: sent %.3f s before this executor "
                                "started (a replay? logged once; counted as drops.stale)",
                                msg.task, self.not_before - msg.t)
                return Drop("stale")
            if self.replay.admit(msg.task, msg.deadline + self.grace, now):
                return Admit(msg, now)
            self.counters.duplicate += 1
            cached = self.replay.reply_for(msg.task)
            return Resend(cached) if cached is not None else InProgress(msg.task)
        if isinstance(msg, Control) and msg.kind == "ping":
            return Respond(encode_control(Control("pong", msg.id, now), self.secret))
        assert isinstance(msg, (Control, Reply))
        self.ignored += 1
        return Drop("ignored")

    def finished(self, task_id: str, reply: bytes) -> None:
        """Remember ``reply`` (encoded) as the answer to any later duplicate of ``task_id``."""
        self.replay.remember_reply(task_id, reply)

    def ack(self, task_id: str, now: float | None = None, since: float | None = None) -> bytes:
        """An encoded ``ack`` control message for ``task_id``; ``since``: its kernel's start,
        while it runs (the progress report the scheduler's run deadline reads)."""
        return encode_control(Control("ack", task_id, time.time() if now is None else now, since),
                              self.secret)

    def _warn_once(self, key: str, fmt: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(fmt, *args)
