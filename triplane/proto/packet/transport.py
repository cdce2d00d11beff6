"""TCP framing, drop counters and replay memory: what an executor keeps around the codec."""

from __future__ import annotations

import asyncio
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any

from triplane.proto.packet.errors import PacketError, PacketMalformed, PacketTooLarge
from triplane.proto.packet.schema import MAX_FRAME_BYTES

# --- TCP framing ---------------------------------------------------------------------

_LEN = struct.Struct(">I")


def frame(payload: bytes) -> bytes:
    """``payload`` with its 4-byte big-endian length prefix, for the TCP transport."""
    if not 0 < len(payload) <= MAX_FRAME_BYTES:
        raise PacketTooLarge(f"frame payload of {len(payload)} bytes (bound 1..{MAX_FRAME_BYTES})")
    return _LEN.pack(len(payload)) + payload


class FrameBuffer:
    """Sans-I/O splitter of a TCP byte stream into frame payloads.

    ``feed`` returns every payload completed so far. A header announcing an empty or an
    oversized frame raises ``PacketMalformed``/``PacketTooLarge`` before any payload byte
    is buffered; the stream has then lost sync and the connection must be closed.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        out: list[bytes] = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n == 0:
                raise PacketMalformed("empty frame")
            if n > self.max_bytes:
                raise PacketTooLarge(f"frame announces {n} bytes; the bound is {self.max_bytes}")
            if len(self._buf) < 4 + n:
                break
            out.append(bytes(self._buf[4:4 + n]))
            del self._buf[:4 + n]
        return out

    @property
    def pending(self) -> int:
        """Bytes buffered towards an incomplete frame."""
        return len(self._buf)


def frame_length(head: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """The payload length a 4-byte frame header announces; ``PacketMalformed`` for 0,
    ``PacketTooLarge`` past ``max_bytes`` (either way the stream has lost sync)."""
    (n,) = _LEN.unpack(head)
    if n == 0:
        raise PacketMalformed("empty frame")
    if n > max_bytes:
        raise PacketTooLarge(f"frame announces {n} bytes; the bound is {max_bytes}")
    return n


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes | None:
    """The next frame payload from ``reader``; ``None`` at a clean end of stream. A stream that
    ends inside a frame raises ``PacketMalformed``; a bad header as in ``FrameBuffer``."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise PacketMalformed("stream ended inside a frame header") from None
        return None
    n = frame_length(head, max_bytes)
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError:
        raise PacketMalformed(f"stream ended inside a frame of {n} bytes") from None


# --- what executors keep ---------------------------------------------------------------


@dataclass
class DropCounters:
    """Packets dropped, by reason (the executor exposes these as metrics). ``count`` takes a
    ``PacketError``; ``duplicate`` is bumped by the caller when ``ReplayGuard.admit`` refuses,
    ``misaddressed`` when a task names another node."""

    oversized: int = 0
    malformed: int = 0
    invalid: int = 0
    version: int = 0
    unsigned: int = 0
    bad_signature: int = 0
    stale: int = 0
    duplicate: int = 0
    misaddressed: int = 0

    def count(self, err: PacketError) -> None:
        """Count one drop under ``err.reason``."""
        setattr(self, err.reason, getattr(self, err.reason) + 1)

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ReplayGuard:
    """Bounded memory of task ids (``<job>.<task>.a<attempt>``) already admitted.

    ``admit`` is true the first time an id is seen and false for a replay or a
    retransmission, for which the executor resends ``reply_for(id)`` if it has one. An entry
    is kept until its packet would be stale anyway (``expires_at``: deadline + grace), so
    within ``capacity`` live entries every replay is caught; beyond it the oldest entry is
    forgotten and ``evicted_live`` counts how often that happened (size capacity above the
    peak number of tasks admitted per deadline window). Memory is about ``capacity`` times
    (id + reply) bytes: 65536 entries of ~300-byte replies hold ~25 MB.
    """

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.evicted_live = 0
        self._seen: OrderedDict[str, list[Any]] = OrderedDict()  # id -> [expires_at, reply]

    def admit(self, task_id: str, expires_at: float, now: float | None = None) -> bool:
        """True (and remembered until ``expires_at``) the first time ``task_id`` is seen;
        false for a duplicate, which the caller drops and counts as ``duplicate``."""
        if task_id in self._seen:
            return False
        now = time.time() if now is None else now
        while self._seen:  # entries are roughly in expiry order: drop expired ones from the front
            first = next(iter(self._seen.values()))
            if first[0] >= now:
                break
            self._seen.popitem(last=False)
        if len(self._seen) >= self.capacity:
            _, (expires, _reply) = self._seen.popitem(last=False)
            self.evicted_live += expires >= now
        self._seen[task_id] = [expires_at, None]
        return True

    def remember_reply(self, task_id: str, reply: bytes) -> None:
        """Keep the encoded reply of an admitted task for retransmissions."""
        entry = self._seen.get(task_id)
        if entry is not None:
            entry[1] = reply

    def reply_for(self, task_id: str) -> bytes | None:
        entry = self._seen.get(task_id)
        return None if entry is None else entry[1]

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._seen

    def __len__(self) -> int:
        return len(self._seen)

