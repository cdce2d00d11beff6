"""The asyncio I/O shell around :class:`DispatchState`: packets, deadlines, node watch.

The shell owns no rules. It turns I/O into events and instructions into I/O:

* ``Send``          -> a signed task packet to the node's UDP port (a packet over 1472
                       bytes goes framed over TCP to the same port number); a grouped
                       task carries its small uploads' values (``carry``) instead of
                       having the executor pull them;
* replies           -> ``TaskSucceeded`` / ``TaskErred`` (the node is the one the state
                       sent the attempt to; a reply for a settled attempt changes nothing);
* ``ack`` controls  -> ``TaskAcked`` (stop retransmitting; with ``since``, the running
                       kernel's start); ``ping`` -> ``pong``;
* a timer           -> ``Tick`` every ``tick_s`` (deadlines, retransmits, drift, job deadlines);
* the registry      -> ``NodeUp`` (with ``slots`` in-flight tasks per executor: two hide
                       the round trip) / ``NodeDown``;
* ``JobFinished`` / ``Transitioned`` / ``Free`` -> the ``Hooks`` the service gives (job
  state and long-pollers; batched metadb writes; batched deletion of intermediate tiles).

Bad packets (malformed, unsigned, forged, oversized) are dropped and counted in
``drops``; nothing a peer sends can raise out of the receive path. The per-task path is
kept lean: one decode, one state step, one encode and ``sendto`` per packet, no logging
at info level and no registry or database call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from triplane.engines.memory.persist import PERSIST_ATTR
from triplane.net.guard import ConnectionGuard, next_frame
from triplane.proto.packet import (
    CARRY_MAX_BYTES,
    MAX_DATAGRAM_BYTES,
    MAX_FRAME_BYTES,
    Carried,
    Control,
    DropCounters,
    PacketError,
    PacketTooLarge,
    Reply,
    TaskPacket,
    attrs_text,
    decode,
    encode_control,
    encode_task,
    frame,
    parse_task_id,
    read_frame,
)
from triplane.proto.packet.group import GROUP_OP
from triplane.proto.states import TaskState
from triplane.registry import NodeInfo, RegistryBackend, watch_nodes
from triplane.scheduler.compiler.jobplan import SCHEDULER_NODE, TaskTemplate, tile_id
from triplane.scheduler.dispatch.state import (
    DispatchState,
    Event,
    Free,
    Instruction,
    JobFinished,
    NodeDown,
    NodeUp,
    Send,
    SubmitJob,
    TaskAcked,
    TaskErred,
    TaskSucceeded,
    Tick,
    Transitioned,
)

log = logging.getLogger(__name__)

ATTRS_TEXTS_KEPT = 64  # grouped templates' attrs texts kept (DispatchShell._attrs_text)


@dataclass
class Hooks:
    """What the service does with the state machine's outputs. Called on the event loop;
    they must not block (queue to a BatchWriter, set an asyncio.Event)."""

    finished: Callable[[JobFinished], None] = lambda f: None
    transitions: Callable[[list[Transitioned]], None] = lambda ts: None
    output: Callable[[str, str, str, Reply], None] = lambda job, task, node, reply: None
    node_down: Callable[[str], None] = lambda node: None
    free: Callable[[Free], None] = lambda f: None  # delete an intermediate tile (batched)
    sending: Callable[[Send], None] = lambda s: None  # a task goes out: keep its tile
    node_up: Callable[[NodeInfo], None] = lambda info: None  # (also for one registered again)


@dataclass
class ShellStats:
    sent: int = 0
    resent: int = 0
    replies: int = 0
    acks: int = 0
    unsendable: int = 0  # Send to a node whose address is unknown (deadline handles it)
    stale_replies: int = 0  # replies for tasks the shell no longer knows
    drops: DropCounters = field(default_factory=DropCounters)


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, shell: DispatchShell) -> None:
        self.shell = shell

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.shell.received(data, addr, MAX_DATAGRAM_BYTES)

    def error_received(self, exc: Exception) -> None:  # e.g. ICMP port unreachable: a node died
        log.debug("udp error: %s", exc)


class DispatchShell:
    """Carries out a :class:`DispatchState`'s instructions over UDP/TCP."""

    def __init__(
        self,
        state: DispatchState,
        secret: bytes,
        templates: Mapping[str, Mapping[str, TaskTemplate]],
        hooks: Hooks | None = None,
        *,
        tick_s: float = 0.025,
        slots: int = 2,
    ) -> None:
        self.state = state
        self.persisting = False  # a job asked to persist its tiles (packets then carry PERSIST_ATTR)
        self.secret = secret
        self.templates = templates  # job -> task -> template (the service fills it before submit)
        self.hooks = hooks or Hooks()
        self.tick_s = tick_s
        self.slots = slots
        self.nodes: dict[str, NodeInfo] = {}
        # input tile -> the executor to pull it from, for the job tiles that refs bind as
        # inputs (scheduler/refs.py); any other input of ``TaskTemplate.uploads`` is an upload
        self.sources: dict[str, str] = {}
        # (node, upload tile) -> its value for a grouped task's packet to carry (proto/packet.md,
        # "Carried values"), or None: pulled as usual (too big, not in memory, cached there)
        self.carry: Callable[[str, str], Carried | None] | None = None
        self._suspects: dict[str, NodeInfo] = {}  # down for us, still registered: probed
        self.stats = ShellStats()
        self.tcp_guard = ConnectionGuard()
        self.port = 0
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._seq = 0
        # node -> its open TCP connection for packets over a datagram (module doc)
        self._conns: dict[str, _Conn] = {}
        # id(a grouped template's attrs) -> (those attrs, their packet text): a compiled step's
        # jobs share one template's attrs (its group program), checked and written once
        self._attrs_texts: OrderedDict[int, tuple[Mapping[str, Any], str]] = OrderedDict()

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind UDP and TCP on one port number (``port`` 0: a free one) and start ticking."""
        loop = asyncio.get_running_loop()
        for _ in range(20):  # the UDP port may be taken for TCP by someone else: retry a free one
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(host, port)
            )
            bound = transport.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(self._serve_tcp, host, bound)
            except OSError:
                transport.close()
                if port:
                    raise
                continue
            self._udp = transport  # type: ignore[assignment]
            self.port = int(bound)
            break
        else:
            raise OSError("no port free for both UDP and TCP")
        self._tasks.append(loop.create_task(self._tick_loop(), name="dispatch-tick"))
        self._tasks.append(loop.create_task(self._probe_suspects(), name="dispatch-probe"))
        return self.port

    def watch(self, registry: RegistryBackend) -> asyncio.Task[None]:
        """Follow the registry's nodes (NodeUp/NodeDown) until the task is cancelled."""
        return asyncio.get_running_loop().create_task(self._watch(registry), name="dispatch-watch")

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()

    # --- events in --------------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        """Feed one event to the state machine and carry out what it says."""
        if type(event) is SubmitJob and event.persist is not None:
            self.persisting = True
        out = self.state.handle(event)
        if out:
            self._carry_out(out)

    def node_up(self, info: NodeInfo) -> None:
        self._suspects.pop(info.node, None)
        self.nodes[info.node] = info
        self.hooks.node_up(info)
        self.handle(NodeUp(f"node-up:{info.node}", info.node, self.slots, time.time()))

    def node_down(self, node: str) -> None:
        self._suspects.pop(node, None)
        self.nodes.pop(node, None)
        conn = self._conns.pop(node, None)
        if conn is not None:
            conn.close()
        self.hooks.node_down(node)
        self.handle(NodeDown(f"node-down:{node}", node, time.time()))

    def received(self, data: bytes, addr: tuple[str, int], max_bytes: int) -> None:
        """One packet from the network: decode, dispatch; a bad one is dropped and counted."""
        try:
            msg = decode(data, self.secret, max_bytes=max_bytes)
            if type(msg) is Reply:
                self._on_reply(msg)
            elif type(msg) is Control:
                self._on_control(msg, addr)
            else:  # a task packet sent to the scheduler: not ours to run
                self.stats.drops.invalid += 1
        except PacketError as e:
            self.stats.drops.count(e)
        except Exception:  # a bug must not kill the receive path; say so loudly
            log.exception("error handling a packet from %s", addr)

    def _on_reply(self, r: Reply) -> None:
        job, task, attempt = parse_task_id(r.task)
        j = self.state.jobs.get(job)
        t = j.tasks.get(task) if j is not None else None
        if t is None or t.attempt != attempt or t.node is None:
            self.stats.stale_replies += 1
            return
        self.stats.replies += 1
        now = time.time()
        if r.ok:
            node, fresh = t.node, t.state == TaskState.DISPATCHED  # fresh: not recorded yet
            out = self.state.handle(TaskSucceeded(f"reply:{r.task}", job, task, attempt, node, now))
            # The output hook runs once the successors' packets are out (before the job's end
            # and the transitions): the next task's round trip does not wait for it.
            record = (lambda: self.hooks.output(job, task, node, r)) if fresh else None
            if out:
                self._carry_out(out, record)
            elif record is not None:
                record()
        else:
            err = r.error
            assert err is not None
            # A failed pull names the input and the node it was to come from (structured).
            peer = err.node if err.kind == "infra" and err.input is not None else None
            if peer is not None and peer in self.nodes and peer != t.node:
                self.suspect(peer)
            self.handle(TaskErred(f"reply:{r.task}", job, task, attempt, t.node, err.kind, err.message,
                                  now, err.input, peer, err.at))

    def suspect(self, node: str) -> None:
        """A peer could not serve a tile from ``node``: treat it as down now (its tiles are
        recomputed from lineage, its tasks drift) rather than wait for its lease to expire,
        which would burn every attempt of the tasks that need its tiles. A probe of its data
        port brings it back if it answers again."""
        info = self.nodes.get(node)
        if info is None:
            return
        log.warning("node %s failed to serve a tile: treating it as down until its data port answers", node)
        self.node_down(node)
        self._suspects[node] = info

    def suspected(self, node: str) -> bool:
        """Is ``node`` down for the dispatcher only because a peer could not read from it
        (its data port is probed; its registration stands)?"""
        return node in self._suspects

    async def _probe_suspects(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for node, info in list(self._suspects.items()):
                try:
                    _, w = await asyncio.wait_for(asyncio.open_connection(info.address, info.data_port), 1.0)
                    w.close()
                except (OSError, asyncio.TimeoutError):
                    continue
                if self._suspects.get(node) is info:
                    log.info("node %s answers again", node)
                    self.node_up(info)

    def _on_control(self, c: Control, addr: tuple[str, int]) -> None:
        if c.kind == "ack":
            self.stats.acks += 1
            with contextlib.suppress(PacketError):
                job, task, attempt = parse_task_id(c.id)
                self.handle(TaskAcked(f"ack:{c.id}", job, task, attempt, time.time(), c.since))
        elif c.kind == "ping" and self._udp is not None:
            self._udp.sendto(encode_control(Control("pong", c.id, time.time()), self.secret), addr)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        if not self.tcp_guard.admit():  # limits as on every port (triplane.net.guard)
            writer.close()
            return
        try:
            while True:
                payload = await next_frame(reader, self.tcp_guard, MAX_FRAME_BYTES)
                if payload is None:
                    return
                self.received(payload, peer, MAX_FRAME_BYTES)
        except PacketError as e:  # the stream lost sync: count it and hang up
            self.stats.drops.count(e)
        except (ConnectionError, OSError):
            pass
        finally:
            self.tcp_guard.leave()
            writer.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self._seq += 1
            try:
                self.handle(Tick(f"tick:{self._seq}", time.time()))
            except Exception:
                log.exception("dispatcher tick failed")

    async def _watch(self, registry: RegistryBackend) -> None:
        while True:
            try:
                async for ev in watch_nodes(registry):
                    if ev.kind == "up" and ev.info is not None:
                        self.node_up(ev.info)
                    elif ev.kind == "down":
                        self.node_down(ev.node)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("node watch failed; restarting it")
                await asyncio.sleep(0.5)

    # --- instructions out -----------------------------------------------------------------------

    def _carry_out(self, out: list[Instruction], sent: Callable[[], None] | None = None) -> None:
        """Packets first, then ``sent`` (a reply's bookkeeping), then job ends and frees in
        their order, then the transitions in one batch. (A Free and a Send of one event never
        concern the same tile: a freed tile's task is done, a sent task is not.)"""
        transitions: list[Transitioned] = []
        rest: list[Instruction] = []
        for ins in out:
            kind = type(ins)
            if kind is Send:
                self._send(ins)  # type: ignore[arg-type]
            elif kind is Transitioned:
                transitions.append(ins)  # type: ignore[arg-type]
            else:
                rest.append(ins)
        if sent is not None:
            sent()
        for ins in rest:
            if type(ins) is JobFinished:
                self.hooks.finished(ins)  # type: ignore[arg-type]
            elif type(ins) is Free:
                self.hooks.free(ins)  # type: ignore[arg-type]
        if transitions:
            self.hooks.transitions(transitions)

    def packet_for(self, s: Send) -> bytes:
        """The signed packet of one Send instruction."""
        tpl = self.templates[s.job][s.task]
        pull = dict.fromkeys(tpl.uploads, SCHEDULER_NODE)
        if self.sources:
            for tile in tpl.uploads:
                if tile in self.sources:
                    pull[tile] = self.sources[tile]
        for dep, node in s.pull_from:
            pull[tile_id(s.job, dep)] = node
        attrs = tpl.attrs
        if self.persisting:  # its output is kept by a persistence target too
            kind = self.state.jobs[s.job].persist
            if kind is not None:
                attrs = {**attrs, PERSIST_ATTR: kind}
        grouped = tpl.op == GROUP_OP
        carried = self._carried(s.node, tpl, pull) if grouped and self.carry is not None else {}
        known = self._attrs_text(attrs) if grouped and attrs is tpl.attrs else None
        p = TaskPacket(
            f"{s.job}.{s.task}.a{s.attempt}",
            tpl.op,
            tpl.inputs,
            tpl.outputs(s.job, s.task) if tpl.tiles else (tile_id(s.job, s.task),),
            s.deadline,
            {t: n for t, n in pull.items() if t not in carried},
            attrs,
            s.node,
            time.time(),
            carried,
        )
        if carried:
            try:
                return encode_task(p, self.secret, known_attrs=known)
            except PacketTooLarge:  # the values and the program together exceed a frame: pulled
                p = p._replace(pull_from=pull, data={})
        return encode_task(p, self.secret, known_attrs=known)

    def _attrs_text(self, attrs: Mapping[str, Any]) -> str | None:
        """``attrs_text(attrs)``, kept for the next packets with the same attrs object
        (templates are immutable); None when the codec refuses them (it then explains)."""
        hit = self._attrs_texts.get(id(attrs))
        if hit is not None and hit[0] is attrs:
            self._attrs_texts.move_to_end(id(attrs))
            return hit[1]
        try:
            text = attrs_text(attrs)
        except PacketError:
            return None
        self._attrs_texts[id(attrs)] = (attrs, text)  # the entry holds attrs: its id is not reused
        while len(self._attrs_texts) > ATTRS_TEXTS_KEPT:
            self._attrs_texts.popitem(last=False)
        return text

    def _carried(self, node: str, tpl: TaskTemplate, pull: Mapping[str, str]) -> dict[str, Carried]:
        """The uploads the scheduler serves that a grouped task's packet carries, up to
        ``CARRY_MAX_BYTES`` in all."""
        assert self.carry is not None
        out: dict[str, Carried] = {}
        room = CARRY_MAX_BYTES
        for tile in tpl.uploads:
            if pull.get(tile) == SCHEDULER_NODE:
                c = self.carry(node, tile)
                if c is not None and len(c.data) <= room:
                    out[tile] = c
                    room -= len(c.data)
        return out

    def _send(self, s: Send) -> None:
        info = self.nodes.get(s.node)
        if info is None or self._udp is None:
            self.stats.unsendable += 1
            return
        try:
            data = self.packet_for(s)
        except (PacketError, KeyError) as e:  # a task the codec refuses: fail it, do not loop
            log.error("cannot encode task %s.%s: %s", s.job, s.task, e)
            self.handle(
                TaskErred(
                    f"encode:{s.job}.{s.task}",
                    s.job,
                    s.task,
                    s.attempt,
                    s.node,
                    "user",
                    f"the task packet cannot be encoded: {e}",
                    time.time(),
                )
            )
            return
        if len(data) <= MAX_DATAGRAM_BYTES:
            self._udp.sendto(data, (info.address, info.udp_port))
        else:
            conn = self._conns.get(s.node)
            if conn is not None and conn.usable(info):
                conn.send(data)
            else:
                task = asyncio.get_running_loop().create_task(self._send_tcp(info, data))
                self._tasks.append(task)
                task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)
        if s.resend:
            self.stats.resent += 1
        else:
            self.stats.sent += 1
            self.hooks.sending(s)  # after the send: nothing runs in between (no await)

    async def _send_tcp(self, info: NodeInfo, data: bytes) -> None:
        """Send a framed task on a new TCP connection to ``info``'s node and keep it for the
        node's next large packets (``_Conn``): what the executor answers on it (acks,
        replies) is read until it closes. A lost TCP send is like a lost datagram: the
        deadline retransmits it."""
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(info.address, info.tcp_port), 5.0)
            conn = _Conn(info, writer)
            old = self._conns.get(info.node)
            if info.node in self.nodes and (old is None or not old.usable(info)):
                self._conns[info.node] = conn  # the node's next large packets go on this one
            conn.send(data)
            await asyncio.wait_for(writer.drain(), 5.0)
            peer = (info.address, info.tcp_port)
            while True:
                payload = await read_frame(reader, MAX_FRAME_BYTES)
                if payload is None:
                    return
                self.received(payload, peer, MAX_FRAME_BYTES)
        except PacketError as e:
            self.stats.drops.count(e)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            if writer is not None:
                if self._conns.get(info.node) is not None and self._conns[info.node].writer is writer:
                    del self._conns[info.node]
                writer.close()


class _Conn:
    """An open TCP connection to an executor's packet port, reused for its node's packets
    over a datagram (a grouped step's packet, each step): no connect and accept per packet.
    It is not reused once idle for ``RETIRE_S`` (the executor closes a connection that
    brings no frame within its idle timeout: a send racing that close would be lost and
    wait for a retransmission), nor when the node's address changed."""

    RETIRE_S = 1.0

    def __init__(self, info: NodeInfo, writer: asyncio.StreamWriter) -> None:
        self.info, self.writer = info, writer
        self.used = time.monotonic()

    def usable(self, info: NodeInfo) -> bool:
        i = self.info
        return (info.address == i.address and info.tcp_port == i.tcp_port and info.pid == i.pid
                and info.started_at == i.started_at and not self.writer.is_closing()
                and time.monotonic() - self.used < self.RETIRE_S)

    def send(self, data: bytes) -> None:
        self.used = time.monotonic()
        self.writer.write(frame(data))

    def close(self) -> None:
        self.writer.close()
