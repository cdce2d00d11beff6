"""The executor's packet server: UDP and TCP on one port number, around ``Intake`` and
``TaskRunner``.

Where replies go (docs/runtime.md, "Task execution", step 4):

* a task that came by UDP is answered to its source address by UDP, or -- when the reply
  is larger than a datagram -- framed over a new TCP connection to the same address and
  port number (the scheduler listens on both);
* a task that came over a TCP connection is answered framed on that connection (while it
  is open; otherwise the reply stays cached and a retransmission gets it).

``ack`` control messages go the same way, when the task pulls inputs or runs its kernel in
a worker thread, and again for a retransmission of a task still running.

Fault injection (``drop_udp``): each incoming and each outgoing datagram is lost with that
probability, drawn from ``random.Random(fault_seed)``; counted in :meth:`stats`.

Limits (``triplane.net.guard``): the TCP port holds at most ``limits.max_connections``
connections, closes one that does not complete a frame within ``limits.idle_timeout``
(unless it waits for the reply of a task it brought) and bounds the frame bytes being
received. Every datagram and frame is checked by its signature before it is parsed
(``Intake``), so unsigned input costs a length check and at most one HMAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Callable
from typing import Any

from triplane.executor.intake import Admit, Drop, InProgress, Intake, Resend, Respond
from triplane.executor.tasks import TaskRunner
from triplane.net.guard import DEFAULT_LIMITS, ConnectionGuard, Limits, next_frame
from triplane.proto.packet import (
    MAX_DATAGRAM_BYTES,
    MAX_FRAME_BYTES,
    PacketError,
    Reply,
    TaskError,
    TaskPacket,
    encode_reply,
    frame,
)

__all__ = ["PacketServer"]

log = logging.getLogger(__name__)

Send = Callable[[bytes], None]


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: PacketServer) -> None:
        self.server = server

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.server._datagram(data, addr)

    def error_received(self, exc: Exception) -> None:  # ICMP port unreachable and the like
        log.debug("udp error: %s", exc)


class PacketServer:
    """Serves task packets on ``host:port`` (UDP and TCP; 0 picks a free number for both)."""

    def __init__(self, intake: Intake, runner: TaskRunner, *, host: str = "127.0.0.1", port: int = 0,
                 drop_udp: float = 0.0, fault_seed: int = 0, limits: Limits = DEFAULT_LIMITS) -> None:
        if not 0.0 <= drop_udp < 1.0:
            raise ValueError(f"drop_udp must be a probability in [0, 1), got {drop_udp}")
        self.intake = intake
        self.runner = runner
        self.host = host
        self.port = port
        self.drop_udp = drop_udp
        self._rng = random.Random(fault_seed)
        self.guard = ConnectionGuard(limits)
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # Set by start(). asyncio.get_running_loop() makes a getpid() system call on every
        # call (CPython 3.11); the packet path asks once per task: 3% of an executor's CPU.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.counts = {"received": 0, "tasks": 0, "replies": 0, "acks": 0, "resent": 0,
                       "injected_drops_in": 0, "injected_drops_out": 0, "reply_failures": 0}

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, attempts: int = 20) -> int:
        """Bind UDP, then TCP on the same number (retrying other numbers if ``port`` is 0
        and the TCP one is taken). Returns the port."""
        loop = self._loop = asyncio.get_running_loop()
        for _ in range(attempts):
            udp, _ = await loop.create_datagram_endpoint(lambda: _Udp(self),
                                                         local_addr=(self.host, self.port))
            port = udp.get_extra_info("sockname")[1]
            with contextlib.suppress(Exception):  # bigger buffers ride out bursts of packets
                udp.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            try:
                self._tcp = await asyncio.start_server(self._tcp_conn, self.host, port)
            except OSError:
                udp.close()
                if self.port:
                    raise
                continue
            self._udp = udp  # type: ignore[assignment]
            self.port = port
            return port
        raise OSError(f"no port free for both UDP and TCP on {self.host} after {attempts} attempts")

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "drops": self.intake.counters.as_dict(), "ignored": self.intake.ignored,
                "in_flight": len(self._tasks), "tcp": self.guard.stats(),
                **{f"tasks_{k}": v for k, v in self.runner.stats.items()}}

    # --- receiving -------------------------------------------------------------------------

    def _lose(self) -> bool:
        return self.drop_udp > 0.0 and self._rng.random() < self.drop_udp

    def _datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._lose():
            self.counts["injected_drops_in"] += 1
            return
        self._handle(data, MAX_DATAGRAM_BYTES, lambda reply: self._reply_udp(reply, addr))

    async def _tcp_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.guard.admit():
            writer.close()
            return
        running = [0]  # tasks this connection brought whose replies it still waits for

        def send(data: bytes) -> None:
            if not writer.is_closing():
                writer.write(frame(data))

        def done(_: object) -> None:
            running[0] -= 1

        def busy() -> bool:
            return running[0] > 0

        try:
            while True:
                try:
                    payload = await next_frame(reader, self.guard, MAX_FRAME_BYTES, busy=busy)
                except PacketError as e:  # the stream lost sync: count and hang up
                    self.intake.counters.count(e)
                    return
                if payload is None:
                    return
                task = self._handle(payload, MAX_FRAME_BYTES, send)
                if task is not None:
                    running[0] += 1
                    task.add_done_callback(done)
        except (ConnectionError, OSError):
            return
        finally:
            self.guard.leave()
            writer.close()

    def _handle(self, data: bytes, max_bytes: int, send: Send) -> asyncio.Task[None] | None:
        """Act on one datagram or frame; the task started for it, if it admitted one."""
        self.counts["received"] += 1
        action = self.intake.receive(data, max_bytes=max_bytes)
        if isinstance(action, Admit):
            self.counts["tasks"] += 1
            task = (self._loop or asyncio.get_running_loop()).create_task(
                self._execute(action.task, action.received, send))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return task
        if isinstance(action, Resend):
            self.counts["resent"] += 1
            send(action.data)
        elif isinstance(action, InProgress):
            self._ack(action.task_id, send)
        elif isinstance(action, Respond):
            send(action.data)
        else:
            assert isinstance(action, Drop)
            log.debug("dropped a packet: %s", action.reason)
        return None

    def _ack(self, task_id: str, send: Send) -> None:
        self.counts["acks"] += 1
        send(self.intake.ack(task_id, since=self.runner.running_since(task_id)))

    async def _execute(self, task: TaskPacket, received: float, send: Send) -> None:
        if task.pull_from:
            self._ack(task.task, send)
        reply = await self.runner.run(task, received, on_slow=lambda tid: self._ack(tid, send))
        try:
            data = encode_reply(reply, self.intake.secret)
        except PacketError as e:  # e.g. a reply over 64 KiB: answer with a short infra error
            log.warning("task %s: reply not encodable (%s)", task.task, e)
            data = encode_reply(Reply(task.task, False, reply.timings, (),
                                      TaskError("infra", f"reply not encodable: {e}"[:900])),
                                self.intake.secret)
        self.counts["replies"] += 1
        try:
            send(data)  # first: the scheduler's next task waits for this reply
        finally:
            self.intake.finished(task.task, data)  # a retransmission gets this copy

    # --- sending -----------------------------------------------------------------------------

    def _reply_udp(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) > MAX_DATAGRAM_BYTES:
            task = asyncio.get_running_loop().create_task(self._reply_tcp(data, addr))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if self._lose():
            self.counts["injected_drops_out"] += 1
            return
        if self._udp is not None and not self._udp.is_closing():
            self._udp.sendto(data, addr)

    async def _reply_tcp(self, data: bytes, addr: tuple[str, int]) -> None:
        """A reply too large for a datagram, framed over TCP to the same address and port."""
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(addr[0], addr[1]), 5.0)
            try:
                writer.write(frame(data))
                await asyncio.wait_for(writer.drain(), 5.0)
            finally:
                writer.close()
        except (OSError, asyncio.TimeoutError) as e:
            self.counts["reply_failures"] += 1
            log.warning("reply over TCP to %s:%s failed: %s", addr[0], addr[1], e)
