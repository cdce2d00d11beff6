"""Per-port limits: connection cap, byte budget, idle timeout of a frame read (no sockets)."""

from __future__ import annotations

import asyncio
import time

import pytest

from triplane.net.guard import ConnectionGuard, Limits, next_frame
from triplane.proto.packet import PacketMalformed, PacketTooLarge, frame


def test_connections_are_capped_and_counted() -> None:
    g = ConnectionGuard(Limits(max_connections=2))
    assert g.admit() and g.admit() and not g.admit()
    g.leave()
    assert g.admit()
    assert g.stats() == {"accepted": 3, "refused": 1, "idle_closed": 0, "over_budget": 0, "open": 2,
                         "bytes_in_flight": 0}


def test_the_byte_budget_is_shared_and_given_back() -> None:
    g = ConnectionGuard(Limits(max_bytes_in_flight=100))
    assert g.take(60) and not g.take(41) and g.take(40)
    g.give(60)
    assert g.take(60) and g.counts["over_budget"] == 1


def test_limits_must_be_positive() -> None:
    for bad in ({"idle_timeout": 0}, {"max_connections": 0}, {"max_bytes_in_flight": 0}):
        with pytest.raises(ValueError):
            Limits(**bad)  # type: ignore[arg-type]


def read(data: bytes, limits: Limits, *, eof: bool = True,
         busy: bool = False) -> tuple[object, ConnectionGuard]:
    async def go() -> tuple[object, ConnectionGuard]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        guard = ConnectionGuard(limits)
        try:
            got: object = await next_frame(reader, guard, 65536, busy=lambda: busy)
        except Exception as e:  # the test looks at what it was
            got = e
        return got, guard

    return asyncio.run(go())


def test_frames_are_read_and_the_budget_returned() -> None:
    got, guard = read(frame(b"hello"), Limits())
    assert got == b"hello" and guard.in_flight == 0
    assert read(b"", Limits())[0] is None  # a clean end of stream


def test_a_half_open_header_is_closed_at_the_idle_timeout() -> None:
    t0 = time.monotonic()
    got, guard = read(b"\x00\x00", Limits(idle_timeout=0.2), eof=False)
    assert got is None and guard.counts["idle_closed"] == 1
    assert time.monotonic() - t0 < 1.0
    got, guard = read(b"\x00\x00\x00\x05he", Limits(idle_timeout=0.2), eof=False)  # a stalled payload
    assert got is None and guard.counts["idle_closed"] == 1 and guard.in_flight == 0


def test_a_connection_waiting_for_its_replies_is_not_idle() -> None:
    async def go() -> object:
        reader = asyncio.StreamReader()
        guard = ConnectionGuard(Limits(idle_timeout=0.1))
        busy = [True]
        read_task = asyncio.ensure_future(next_frame(reader, guard, 65536, busy=lambda: busy[0]))
        await asyncio.sleep(0.35)
        assert not read_task.done()
        reader.feed_data(frame(b"next"))
        return await read_task

    assert asyncio.run(go()) == b"next"


def test_bad_headers_and_over_budget_frames() -> None:
    assert isinstance(read(b"\x00\x00\x00\x00", Limits())[0], PacketMalformed)
    assert isinstance(read(b"\x00\x02\x00\x01", Limits())[0], PacketTooLarge)
    assert isinstance(read(b"\x00\x00", Limits())[0], PacketMalformed)  # ends inside a header
    got, guard = read(frame(b"x" * 200), Limits(max_bytes_in_flight=100))
    assert got is None and guard.counts["over_budget"] == 1
