"""Executor processes on loopback, driven by this test acting as the scheduler.

A real etcd (started here) is the registry; executors run as ``python -m triplane.executor``
subprocesses. Task packets go over UDP (and TCP) encoded with the codec; tiles go in and out
through the data port client. Every process started here is killed at the end, even on
failure, and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triplane.net.dataport import DataClient, DataPortError
from triplane.proto.packet import (
    Control,
    Reply,
    TaskPacket,
    decode,
    encode_task,
    frame,
)
from triplane.registry import connect_registry, list_nodes
from triplane.registry.etcd_server import ETCD_APT_PACKAGE, EtcdServer, find_etcd_binary

pytest.importorskip("aetcd", reason="the etcd backend needs the 'aetcd' package")
if find_etcd_binary() is None:
    pytest.skip(f"no etcd binary: apt-get install -y {ETCD_APT_PACKAGE}", allow_module_level=True)

SECRET = b"executor-integration-test-secret"
TTL_S = 5.0  # the executor's registration lease


# --- harness ------------------------------------------------------------------------------


def registry_call(url: str, fn: Callable[[Any], Any]) -> Any:
    async def go() -> Any:
        backend = connect_registry(url)
        try:
            return await fn(backend)
        finally:
            await backend.close()

    return asyncio.run(asyncio.wait_for(go(), 10))


def nodes(url: str) -> dict[str, Any]:
    return {n.node: n for n in registry_call(url, list_nodes)}


def eventually(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Cluster:
    """etcd + executor subprocesses; ``close()`` kills everything it started."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.etcd = EtcdServer(tmp / "etcd")
        self.etcd.start()
        self.secret_file = tmp / "secret"
        self.secret_file.write_bytes(SECRET)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return self.etcd.url

    def start(self, name: str, *extra: str, memory: str = "64MiB") -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "triplane.executor", "--registry", self.url, "--name", name,
             "--memory", memory, "--secret-file", str(self.secret_file), "--log-level", "debug", *extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = proc
        return proc

    def wait_up(self, *names: str, timeout: float = 20.0) -> dict[str, Any]:
        def up() -> dict[str, Any] | None:
            for n in names:
                p = self.procs[n]
                if p.poll() is not None:
                    raise AssertionError(f"executor {n} exited with {p.returncode}:\n{self.log(n)}")
            found = nodes(self.url)
            return found if all(n in found for n in names) else None

        return eventually(up, timeout, f"executors {names} to register")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-4000:]

    def stats(self, name: str) -> dict[str, Any] | None:
        entry = registry_call(self.url, lambda b: b.get(f"stats/{name}"))
        return None if entry is None else json.loads(entry.value)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.etcd.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("executors"))
    try:
        c.start("exa")
        c.start("exb")
        c.start("exlossy", "--drop-udp", "0.2", "--fault-seed", "7")
        c.wait_up("exa", "exb", "exlossy")
        yield c
    finally:
        c.close()


class Scheduler:
    """This test's side of the packet protocol: a UDP socket (+ a TCP listener on the same
    port for replies too large for a datagram)."""

    def __init__(self) -> None:
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.acks: list[str] = []

    def close(self) -> None:
        self.udp.close()

    def send_raw(self, data: bytes, node: Any) -> None:
        self.udp.sendto(data, ("127.0.0.1", node.udp_port))

    def receive(self, timeout: float) -> Any:
        self.udp.settimeout(timeout)
        try:
            data, _ = self.udp.recvfrom(65536)
        except TimeoutError:
            return None
        return data

    def run(self, packet: bytes, node: Any, task_id: str, *, timeout: float = 10.0,
            retransmit_s: float | None = None) -> tuple[Reply, bytes]:
        """Send until the reply for ``task_id`` arrives (retransmitting every ``retransmit_s``
        if given, as the real scheduler does; acks do not stop it here)."""
        deadline = time.monotonic() + timeout
        self.send_raw(packet, node)
        next_send = time.monotonic() + (retransmit_s or timeout)
        while time.monotonic() < deadline:
            data = self.receive(max(0.01, min(next_send, deadline) - time.monotonic()))
            if data is None:
                if retransmit_s is not None and time.monotonic() >= next_send:
                    self.send_raw(packet, node)
                    next_send = time.monotonic() + retransmit_s
                continue
            msg = decode(data, SECRET)
            if isinstance(msg, Control):
                self.acks.append(msg.id)
            elif isinstance(msg, Reply) and msg.task == task_id:
                return msg, data
        raise AssertionError(f"no reply for {task_id} within {timeout} s")


@pytest.fixture
def sched() -> Iterator[Scheduler]:
    s = Scheduler()
    try:
        yield s
    finally:
        s.close()


def task(task_id: str, op: str, ins: list[str], out: str, *, attrs: dict[str, Any] | None = None,
         pull: dict[str, str] | None = None, deadline: float | None = None, to: str = "exa") -> bytes:
    p = TaskPacket(task_id, op, tuple(ins), (out,), deadline if deadline is not None else time.time() + 30,
                   pull or {}, attrs or {}, to, time.time())
    return encode_task(p, SECRET)


def data(fn: Callable[[DataClient], Any]) -> Any:
    async def go() -> Any:
        async with DataClient(SECRET, io_timeout=20) as client:
            return await fn(client)

    return asyncio.run(asyncio.wait_for(go(), 30))


# --- tests ----------------------------------------------------------------------------------


def test_registration_publishes_ports_engines_and_memory(cluster: Cluster) -> None:
    found = nodes(cluster.url)
    a = found["exa"]
    assert a.address == "127.0.0.1" and a.udp_port == a.tcp_port > 0 and a.data_port > 0
    assert a.pid == cluster.procs["exa"].pid

    async def engines(b: Any) -> Any:
        from triplane.registry import list_memory_engines, list_op_engines
        return await list_op_engines(b, "exa"), await list_memory_engines(b, "exa")

    ops, mems = registry_call(cluster.url, engines)
    assert ops[0].kind == "numpy" and "matmul" in ops[0].ops and ops[0].gflops > 0
    assert mems[0].capacity == 64 << 20


def test_matmul_on_tiles_put_through_the_data_port(cluster: Cluster, sched: Scheduler) -> None:
    a_node = nodes(cluster.url)["exa"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 48), dtype=np.float32)
    w = rng.standard_normal((48, 32), dtype=np.float32)
    data(lambda c: asyncio.gather(c.put("127.0.0.1", a_node.data_port, "j1.x", x),
                                  c.put("127.0.0.1", a_node.data_port, "j1.w", w)))
    reply, _ = sched.run(task("j1.n0.a0", "matmul", ["j1.x", "j1.w"], "j1.n0"), a_node, "j1.n0.a0")
    assert reply.ok, reply.error
    assert reply.outputs[0].tile == "j1.n0" and reply.outputs[0].shape == (64, 32)
    assert reply.outputs[0].dtype == "float32" and reply.outputs[0].bytes == 64 * 32 * 4
    assert reply.timings.queued <= reply.timings.start <= reply.timings.end
    got = data(lambda c: c.get("127.0.0.1", a_node.data_port, "j1.n0"))
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)


def test_input_produced_on_a_is_pulled_by_b(cluster: Cluster, sched: Scheduler) -> None:
    found = nodes(cluster.url)
    a_node, b_node = found["exa"], found["exb"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.full((4, 2), 0.5, dtype=np.float32)
    data(lambda c: asyncio.gather(c.put("127.0.0.1", a_node.data_port, "j2.x", x),
                                  c.put("127.0.0.1", b_node.data_port, "j2.y", y)))
    r1, _ = sched.run(task("j2.n1.a0", "neg", ["j2.x"], "j2.n1"), a_node, "j2.n1.a0")
    assert r1.ok, r1.error
    r2, _ = sched.run(task("j2.n2.a0", "matmul", ["j2.n1", "j2.y"], "j2.n2", pull={"j2.n1": "exa"}, to="exb"),
                      b_node, "j2.n2.a0")
    assert r2.ok, r2.error
    assert "j2.n2.a0" in sched.acks  # a task that pulls is acked before it runs
    got = data(lambda c: c.get("127.0.0.1", b_node.data_port, "j2.n2"))
    np.testing.assert_allclose(got, (-x) @ y)
    with pytest.raises(DataPortError, match=r"no such tile: j2\.n1") as err:  # pulled, not kept
        data(lambda c: c.get("127.0.0.1", b_node.data_port, "j2.n1"))
    assert err.value.missing
    # A pull from a node that holds nothing is an infra error: the scheduler drifts it.
    r3, _ = sched.run(task("j2.n3.a0", "neg", ["j2.gone"], "j2.n3", pull={"j2.gone": "exa"}, to="exb"),
                      b_node, "j2.n3.a0")
    assert not r3.ok and r3.error.kind == "infra" and "no such tile: j2.gone" in r3.error.message


def test_kernel_error_is_a_user_error_and_the_process_survives(cluster: Cluster, sched: Scheduler) -> None:
    a_node = nodes(cluster.url)["exa"]
    data(lambda c: asyncio.gather(
        c.put("127.0.0.1", a_node.data_port, "j3.x", np.ones(5, np.float32)),
        c.put("127.0.0.1", a_node.data_port, "j3.i", np.array([1, 9], np.int64))))
    reply, _ = sched.run(task("j3.n0.a0", "gather", ["j3.x", "j3.i"], "j3.n0"), a_node, "j3.n0.a0")
    assert not reply.ok and reply.error.kind == "user" and "out of range" in reply.error.message
    assert reply.outputs == ()
    bogus = task("j3.n1.a0", "neg", ["j3.x"], "j3.n1", attrs={"bogus": 1})
    bad_attr, _ = sched.run(bogus, a_node, "j3.n1.a0")
    assert not bad_attr.ok and bad_attr.error.kind == "user" and "bogus" in bad_attr.error.message
    ok, _ = sched.run(task("j3.n2.a0", "neg", ["j3.x"], "j3.n2"), a_node, "j3.n2.a0")
    assert ok.ok and cluster.procs["exa"].poll() is None


def test_memory_full_is_an_infra_error(cluster: Cluster, sched: Scheduler) -> None:
    a_node = nodes(cluster.url)["exa"]
    big = {"value": 1.0, "shape": [8192, 4096], "dtype": "float32"}  # 128 MiB > 64 MiB
    reply, _ = sched.run(task("j4.n0.a0", "full", [], "j4.n0", attrs=big), a_node, "j4.n0.a0")
    assert not reply.ok and reply.error.kind == "infra" and reply.error.message.startswith("memory full")
    with pytest.raises(DataPortError, match="memory full"):
        data(lambda c: c.put("127.0.0.1", a_node.data_port, "j4.big", np.zeros(20 << 20, np.float32)))
    small = {"value": 2.0, "shape": [4], "dtype": "float32"}
    ok, _ = sched.run(task("j4.n1.a0", "full", [], "j4.n1", attrs=small), a_node, "j4.n1.a0")
    assert ok.ok
    np.testing.assert_array_equal(data(lambda c: c.get("127.0.0.1", a_node.data_port, "j4.n1")),
                                  np.full(4, 2.0, np.float32))


def test_duplicate_task_gets_the_cached_reply(cluster: Cluster, sched: Scheduler) -> None:
    a_node = nodes(cluster.url)["exa"]
    packet = task("j5.n0.a0", "full", [], "j5.n0", attrs={"value": 3, "shape": [2], "dtype": "int32"})
    first, raw1 = sched.run(packet, a_node, "j5.n0.a0")
    assert first.ok
    _, raw2 = sched.run(packet, a_node, "j5.n0.a0")
    assert raw2 == raw1  # the same bytes: not run again
    eventually(lambda: (cluster.stats("exa") or {}).get("drops", {}).get("duplicate", 0) >= 1, 5,
               "the duplicate to be counted")


def test_bad_packets_are_dropped_and_counted_while_serving(cluster: Cluster, sched: Scheduler) -> None:
    b_node = nodes(cluster.url)["exb"]
    before = cluster.stats("exb") or {"drops": {}}
    one = {"value": 1, "shape": [1]}
    good = json.loads(task("j6.n0.a0", "full", [], "j6.n0", attrs=one, to="exb"))
    unsigned = dict(good)
    del unsigned["sig"]
    stale = task("j6.n9.a0", "full", [], "j6.n9", attrs=one, deadline=time.time() - 60, to="exb")
    forged = TaskPacket("j6.n8.a0", "full", (), ("j6.n8",), time.time() + 30, {}, one, "exb", time.time())
    for_a = task("j6.n7.a0", "full", [], "j6.n7", attrs=one, to="exa")  # signed, for another node
    for raw in (b"\xff\xfe not yaml {{{", b"x" * 2000, json.dumps(unsigned).encode(),
                encode_task(forged, b"some-other-secret-of-16+-bytes"), stale, b"[1, 2, 3]", for_a):
        sched.send_raw(raw, b_node)
    reply, _ = sched.run(task("j6.n0.a0", "full", [], "j6.n0", attrs=one, to="exb"), b_node, "j6.n0.a0")
    assert reply.ok
    assert sched.receive(0.2) is None  # nothing answered the bad ones

    def counted() -> dict[str, int] | None:
        drops = (cluster.stats("exb") or {}).get("drops", {})
        want = {"oversized": 1, "unsigned": 3, "bad_signature": 1, "stale": 1, "misaddressed": 1}
        ok = all(drops.get(k, 0) - before["drops"].get(k, 0) >= v for k, v in want.items())
        return drops if ok else None

    eventually(counted, 5, "drops to be counted")
    # A TCP stream that loses sync is hung up on; the server keeps serving.
    with socket.create_connection(("127.0.0.1", b_node.tcp_port), timeout=5) as s:
        s.sendall(struct.pack(">I", 1 << 30))
        assert s.recv(10) == b""
    assert cluster.procs["exb"].poll() is None


def test_large_packet_goes_over_tcp(cluster: Cluster) -> None:
    a_node = nodes(cluster.url)["exa"]
    tile = "j7.x." + "p" * 120
    data(lambda c: c.put("127.0.0.1", a_node.data_port, tile, np.arange(3, dtype=np.float32)))
    packet = task("j7.n0.a0", "concat", [tile] * 14, "j7.n0")
    assert len(packet) > 1472
    with socket.create_connection(("127.0.0.1", a_node.tcp_port), timeout=10) as s:
        s.sendall(frame(packet))
        buf = b""
        while True:
            chunk = s.recv(65536)
            assert chunk, "connection closed before the reply"
            buf += chunk
            if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                break
    reply = decode(buf[4:4 + struct.unpack(">I", buf[:4])[0]], SECRET, max_bytes=65536)
    assert isinstance(reply, Reply) and reply.ok and reply.outputs[0].shape == (42,)
    got = data(lambda c: c.get("127.0.0.1", a_node.data_port, "j7.n0"))
    np.testing.assert_array_equal(got, np.tile(np.arange(3, dtype=np.float32), 14))


def test_lossy_executor_answers_retransmitted_packets(cluster: Cluster, sched: Scheduler) -> None:
    node = nodes(cluster.url)["exlossy"]
    for i in range(25):
        attrs = {"value": float(i), "shape": [3], "dtype": "float32"}
        reply, _ = sched.run(task(f"j8.n{i}.a0", "full", [], f"j8.n{i}", attrs=attrs, to="exlossy"), node,
                             f"j8.n{i}.a0", timeout=15, retransmit_s=0.1)
        assert reply.ok
    got = data(lambda c: c.get("127.0.0.1", node.data_port, "j8.n24"))
    np.testing.assert_array_equal(got, np.full(3, 24.0, np.float32))
    stats = eventually(lambda: (s := cluster.stats("exlossy")) and s["tasks_ok"] >= 25 and s, 5, "stats")
    assert stats["injected_drops_in"] + stats["injected_drops_out"] > 0
    assert stats["drops"]["duplicate"] > 0  # retransmissions were recognised, not run twice
    assert stats["tasks_ok"] == 25


def test_sigterm_deregisters_at_once_and_sigkill_by_lease_expiry(cluster: Cluster) -> None:
    term, kill = cluster.start("exterm"), cluster.start("exkill")
    cluster.wait_up("exterm", "exkill")
    term.send_signal(signal.SIGTERM)
    assert term.wait(10) == 0
    t0 = time.monotonic()
    eventually(lambda: "exterm" not in nodes(cluster.url), 2.0, "exterm to deregister")
    assert time.monotonic() - t0 < TTL_S / 2  # not by lease expiry
    os.kill(kill.pid, signal.SIGKILL)
    kill.wait(10)
    killed_at = time.monotonic()
    assert "exkill" in nodes(cluster.url)  # nobody deregistered it ...
    eventually(lambda: "exkill" not in nodes(cluster.url), TTL_S + 5, "exkill's lease to expire")
    assert time.monotonic() - killed_at > 1.0  # ... its lease ran out


def test_round_trip_of_tiny_tasks(cluster: Cluster, sched: Scheduler,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    node = nodes(cluster.url)["exb"]
    packets = [task(f"j9.n{i}.a0", "full", [], f"j9.n{i}", attrs={"value": i, "shape": []}, to="exb")
               for i in range(300)]
    t0 = time.perf_counter()
    for i, p in enumerate(packets):
        reply, _ = sched.run(p, node, f"j9.n{i}.a0", timeout=5)
        assert reply.ok
    per_task = (time.perf_counter() - t0) / len(packets)
    with capsys.disabled():
        print(f"\n  one executor process, sequential no-op tasks over UDP: {per_task * 1e6:.0f} µs "
              f"round trip ({1 / per_task:.0f} tasks/s)")
    assert sched.acks == []  # tiny local tasks are not acked: the reply is the ack
