"""Strangers on the wire against a real local cluster (issue 11, "Must show"): an unsigned
flood on an executor's packet (UDP, TCP) and data ports for 10 s leaves it registered and a
job started during the flood correct; half-open connections are closed within the idle
timeout; the connection cap holds; a task signed for one node is refused by another; a
recorded data-port request cannot be replayed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import triplane as tp
from triplane.executor.config import load_secret
from triplane.launcher import LocalCluster
from triplane.proto.dataport import LENGTH, TAG_BYTES, encode_request, parse_response
from triplane.proto.packet import TaskPacket, encode_task, frame
from triplane.sdk.remote import RemoteSession

FLOOD_S = 10.0
IDLE_S = 2.0


def session(cluster: LocalCluster) -> RemoteSession:
    return RemoteSession(cluster.url, cluster.token, job_timeout_s=90.0, poll_s=0.5)


def junk_frame(n: int, fake_sig: bool) -> bytes:
    """``n`` bytes of YAML-looking junk; with a well-formed but wrong sig member (one HMAC
    each to refuse), else unsigned (refused without one)."""
    body = (b"a: [" + b"x, " * (n // 3))[: n - 80] + b"]"
    if fake_sig:
        return b"{" + body + b',"sig":"' + b"0" * 64 + b'"}'
    return body + b" " * (n - len(body))


class Flood:
    """Threads that send unsigned junk at one executor's ports until stopped."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.stop = threading.Event()
        self.sent = {"udp": 0, "tcp": 0, "data": 0}
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._udp, self._tcp_packets, self._tcp_data)]

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)

    def _paced(self, rate_bytes_s: float, size: int, send: Callable[[int], None]) -> None:
        i, t0 = 0, time.monotonic()
        while not self.stop.is_set():
            send(i)
            i += 1
            ahead = i * size / rate_bytes_s - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)

    def _udp(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        frames = [junk_frame(1400, False), junk_frame(1400, True)]

        def send(i: int) -> None:
            s.sendto(frames[i % 2], (self.node["address"], self.node["udp_port"]))
            self.sent["udp"] += 1

        self._paced(4e6, 1400, send)
        s.close()

    def _stream(self, port: int, payloads: list[bytes], key: str) -> None:
        conn: list[socket.socket] = []

        def send(i: int) -> None:
            try:
                if not conn:
                    conn.append(socket.create_connection((self.node["address"], port), timeout=2))
                conn[0].sendall(payloads[i % len(payloads)])
                self.sent[key] += 1
            except OSError:  # the server hung up on us (as it should): dial again
                if conn:
                    conn.pop().close()

        self._paced(4e6, len(payloads[0]), send)
        for c in conn:
            c.close()

    def _tcp_packets(self) -> None:
        self._stream(self.node["tcp_port"], [frame(junk_frame(65536, False)), frame(junk_frame(65536, True))],
                     "tcp")

    def _tcp_data(self) -> None:
        # Data-port request frames of 64 KiB with a junk tag: each costs the server one HMAC.
        junk = LENGTH.pack(65536) + b"\x01" * TAG_BYTES + junk_frame(65536, False)
        self._stream(self.node["data_port"], [junk], "data")


def half_open(address: str, port: int, n: int) -> list[socket.socket]:
    """``n`` connections that send two header bytes and then nothing."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((address, port), timeout=5)
        s.sendall(b"\x00\x00")
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket, within_s: float) -> bool:
    s.settimeout(within_s)
    try:
        return s.recv(100) == b""
    except TimeoutError:
        return False
    except OSError:  # reset: closed too
        return True


def test_an_unsigned_flood_leaves_the_executor_registered_and_the_job_correct(
        start_cluster: Callable[..., Any]) -> None:
    rng = np.random.default_rng(11)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    want = np.tanh(np.tanh(a @ b) @ b).sum(axis=0)
    args = ["--idle-timeout", str(IDLE_S), "--max-connections", "64"]
    with start_cluster(bound_s=150, executors=2, executor_args=args) as cluster:
        nodes = cluster.registered()
        victim = next(n for n in nodes if n["pid"] == cluster.executors[0].pid)
        lingering = (half_open(victim["address"], victim["tcp_port"], 20)
                     + half_open(victim["address"], victim["data_port"], 20))
        seen_down: list[float] = []
        result: list[np.ndarray] = []
        t0 = time.monotonic()
        with Flood(victim) as flood:
            # Half-open connections go at the idle timeout, flood or not.
            assert all(closed_by_server(s, IDLE_S + 3.0) for s in lingering)
            idle_closed_s = time.monotonic() - t0
            with session(cluster) as s:
                x, w = tp.Tensor.from_array(a), tp.Tensor.from_array(b)
                result.append(s.evaluate([tp.tanh(tp.tanh(x @ w) @ w).sum(axis=0)])[0])
            while time.monotonic() - t0 < FLOOD_S:
                if victim["pid"] not in {n["pid"] for n in cluster.registered()}:
                    seen_down.append(time.monotonic() - t0)
                time.sleep(0.5)
        for s in lingering:
            s.close()
        assert not seen_down, f"the flooded executor left the registry at {seen_down} s"
        assert victim["pid"] in {n["pid"] for n in cluster.registered()}
        np.testing.assert_allclose(result[0], want, rtol=1e-4, atol=1e-3)
        assert min(flood.sent.values()) > 0, flood.sent
        print(f"flood for {FLOOD_S:g} s: {flood.sent} frames/datagrams sent; half-open "
              f"connections closed after {idle_closed_s:.1f} s (idle timeout {IDLE_S:g} s)")


def test_connection_cap_node_destination_and_replayed_requests(start_cluster: Callable[..., Any]) -> None:
    with start_cluster(bound_s=90, executors=2, executor_args=["--max-connections", "8"]) as cluster:
        secret = load_secret(cluster.run.secret_file)
        na, nb = sorted(cluster.registered(), key=lambda n: n["node"])

        # The cap: 8 connections held open, the 9th is closed at once; when they go, it frees up.
        held = [socket.create_connection((nb["address"], nb["data_port"]), timeout=5) for _ in range(8)]
        time.sleep(0.3)
        extra = socket.create_connection((nb["address"], nb["data_port"]), timeout=5)
        assert closed_by_server(extra, 2.0)
        for s in held:
            s.close()
        time.sleep(0.3)

        # A data-port request is single-use: the same bytes again are refused as a replay.
        request, _ = encode_request("stat", secret, now=time.time(), tile="u-none")
        answers = []
        for _ in range(2):
            with socket.create_connection((nb["address"], nb["data_port"]), timeout=5) as s:
                s.sendall(request)
                (n,) = LENGTH.unpack(recv_exactly(s, 4))
                answers.append(parse_response(recv_exactly(s, TAG_BYTES + n)[TAG_BYTES:]))
        assert [r.kind for r in answers] == ["missing", "replay"]

        # A task signed for node A is refused by node B (and never answered).
        p = TaskPacket("jx.n0.a0", "full", (), ("jx.n0",), time.time() + 30, {},
                       {"value": 1.0, "shape": [1], "dtype": "float32"}, na["node"], time.time())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.settimeout(1.0)
            u.sendto(encode_task(p, secret), (nb["address"], nb["udp_port"]))
            try:
                got = u.recvfrom(65536)
            except TimeoutError:
                got = None
            assert got is None
            u.sendto(encode_task(p, secret), (na["address"], na["udp_port"]))  # its own node runs it
            assert u.recvfrom(65536)[0]


def recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed early"
        buf += chunk
    return buf



def test_a_poisoned_data_address_fails_the_job_and_never_changes_a_value(
        start_cluster: Callable[..., Any]) -> None:
    """The attack of issue 11: ``scheduler/data`` pointed at a server without the secret that
    answers every pull with 8s. The job must fail with a clear error, never finish wrong."""
    import asyncio
    import json

    from triplane.proto.packet import canonical
    from triplane.registry import connect_registry

    async def impostor(r: Any, w: Any) -> None:
        try:
            while True:
                (n,) = LENGTH.unpack(await r.readexactly(4))
                await r.readexactly(TAG_BYTES + n)
                header = canonical({"v": 1, "ok": True, "shape": [4], "dtype": "float32", "bytes": 16})
                w.write(LENGTH.pack(len(header)) + b"\x01" * TAG_BYTES + header
                        + np.full(4, 8, np.float32).tobytes() + b"\x02" * TAG_BYTES)
                await w.drain()
        except Exception:
            w.close()

    async def poison(url: str, port: int, secret: bytes) -> None:
        # A client token cannot write the registry at all (403: tests/unit/registry); this
        # is an insider with the node credential, or a registry reached some other way.
        backend = connect_registry(url, secret=secret)
        try:
            where = {"address": "127.0.0.1", "data_port": port}
            await backend.put("scheduler/data", json.dumps(where).encode())
        finally:
            await backend.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(impostor, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    pump = threading.Thread(target=loop.run_forever, daemon=True)
    pump.start()
    try:
        with start_cluster(bound_s=120, executors=2) as cluster:
            secret = cluster.run.secret_file.read_bytes().strip()
            asyncio.run(poison(cluster.executor_registry, port, secret))
            with session(cluster) as s:
                x = tp.Tensor.from_array(np.arange(4, dtype=np.float32))
                try:
                    got: Any = s.evaluate([x + 1])[0]
                except Exception as e:  # the job failed: that is the point
                    got = e
            assert not isinstance(got, np.ndarray) or np.array_equal(got, [1, 2, 3, 4]), got
            if isinstance(got, Exception):
                assert "not authenticated" in str(got) or "secret" in str(got), got
            print(f"poisoned scheduler/data: {type(got).__name__}: {str(got)[:300]}")
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        pump.join(5)
