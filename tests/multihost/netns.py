"""A small network of hosts on one machine: Linux network namespaces on a private bridge.

    Network(["etcd", "sched-a", ...]).start()

makes a switch namespace ``<prefix>-sw`` holding a bridge, and per host a namespace
``<prefix>-<host>`` whose ``eth0`` is one end of a veth pair, the other end a port of the
bridge. Host *i* gets ``10.213.0.<10 + i>/24``; the range exists only inside these
namespaces (nothing is added to the machine's own namespace: its links, routes and
addresses are untouched), so traffic flows only between the hosts made here.

Code runs *on* a host through :meth:`Host.call`: a worker thread of that host has entered
its namespace (``setns``), so the sockets it opens and the processes it starts (a child
inherits its parent thread's namespaces) live there. :meth:`Network.cut` takes a host's
bridge port down (a partition: its packets go nowhere) and :meth:`Network.heal` brings it
back. ``close()`` kills every process started on a host and every process left in the
namespaces, and deletes the namespaces (and with them every link). The prefix holds the
pid of the process that made them: ``cleanup_leftovers()`` removes the namespaces of a
process that died without closing them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PREFIX = "tpmh"
SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (the multi-host tests run as root in .ci/run)"
    if subprocess.run(["which", "ip"], capture_output=True, check=False).returncode != 0:
        return "the ip command (iproute2) is not installed"
    name = f"{PREFIX}{os.getpid()}-probe"
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _kill_namespace(ns: str) -> None:
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", ns, check=False)


def cleanup_leftovers() -> list[str]:
    """Delete the namespaces (and kill their processes) of harness runs whose process is gone."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if not ns.startswith(PREFIX):
            continue
        owner = ns[len(PREFIX):].partition("x")[0]
        alive = owner.isdigit() and Path(f"/proc/{owner}").exists()
        if not alive:
            _kill_namespace(ns)
            removed.append(ns)
    return removed


_here = threading.local()  # .ns: the namespace a host's worker thread entered


def _enter(ns: str) -> None:
    _here.ns = ns
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
    finally:
        os.close(fd)


class Host:
    """One host: a namespace, an address, and a worker thread inside it."""

    def __init__(self, name: str, ns: str, ip: str, port: str) -> None:
        self.name, self.ns, self.ip, self.port = name, ns, ip, port
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{name}",
                                       initializer=_enter, initargs=(ns,))
        self.procs: list[subprocess.Popen[bytes]] = []

    def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``fn(*args, **kw)`` run on this host (its sockets and children in its namespace);
        called on this host's thread already, it runs at once."""
        if getattr(_here, "ns", None) == self.ns:
            return fn(*args, **kw)
        return self.pool.submit(fn, *args, **kw).result()

    def popen(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        def start() -> subprocess.Popen[bytes]:
            with open(log, "ab") as out:
                return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        p = self.call(start)
        self.procs.append(p)
        return p

    def stop_all(self, grace_s: float = 3.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.05, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait(5)
        self.pool.shutdown(wait=False, cancel_futures=True)


class Network:
    """The switch and the hosts (use as a context manager, or ``start()``/``close()``)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.prefix = f"{PREFIX}{os.getpid()}x{time.monotonic_ns() % 100000}"
        self.switch = f"{self.prefix}-sw"
        self.hosts: dict[str, Host] = {}
        self.names = list(names)

    def start(self) -> Network:
        cleanup_leftovers()
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                ns, port, ip = f"{self.prefix}-{name}", f"v{i}", f"{SUBNET}.{10 + i}"
                _ip("netns", "add", ns)
                _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                    "netns", ns)
                _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.hosts[name] = Host(name, ns, ip, port)
        except BaseException:
            self.close()
            raise
        return self

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def cut(self, name: str) -> None:
        """Partition ``name`` from every other host (its bridge port down)."""
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "down")

    def heal(self, name: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "up")

    def link_bytes(self, name: str) -> dict[str, int]:
        """Bytes ``name``'s eth0 sent and received since it was made (the kernel's counters)."""
        out = _ip("-n", self.hosts[name].ns, "-s", "-j", "link", "show", "eth0").stdout
        stats = json.loads(out)[0]["stats64"]
        return {"tx": int(stats["tx"]["bytes"]), "rx": int(stats["rx"]["bytes"])}

    def close(self) -> None:
        """Every process, namespace and link made here gone (safe to call twice)."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.stop_all()
        for host in self.hosts.values():
            _kill_namespace(host.ns)
        _kill_namespace(self.switch)
        self.hosts.clear()

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
