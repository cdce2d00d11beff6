"""A triplane cluster on network-namespace hosts (netns.py): the multi-host tests' fixture
(conftest.py) and bench/hosts.py start it with :func:`running`. The default layout:

    db       10.213.0.10  etcd (client port 2379) and PostgreSQL (5432)
    sched-a  10.213.0.11  scheduler (started first: the leader)
    sched-b  10.213.0.12  scheduler (standby)
    exec-1..3 .13-.15     executors, configured by a TOML file, bound to 0.0.0.0 (the
                          address they publish is found from the route to etcd)
    client   10.213.0.16  where the tests' HTTP calls come from

:func:`missing` says why it cannot run here (not root, no etcd, no PostgreSQL server).
Every process and namespace is removed when :func:`running` ends, also on an error; a
watchdog does it after ``bound_s`` so nothing can hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import netns

TOKEN = "multihost-token-0123456789abcdef"
SECRET = "multihost-secret-0123456789abcdef"
HOSTS = ["db", "sched-a", "sched-b", "exec-1", "exec-2", "exec-3", "client"]
EXECUTORS = ["exec-1", "exec-2", "exec-3"]


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = cond()
        except (httpx.HTTPError, OSError):
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class MultiHost:
    """The running cluster and the tests' handles on it."""

    def __init__(self, net: netns.Network, tmp: Path) -> None:
        self.net, self.tmp = net, tmp
        self.etcd: Any = None
        self.pg: Any = None
        self.schedulers: dict[str, Any] = {}
        self.executors: dict[str, Any] = {}
        self._client: httpx.Client | None = None

    # --- HTTP from the client host -----------------------------------------------------------

    def http(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """A request made from the client host (its socket in the client namespace)."""
        def go() -> httpx.Response:
            if self._client is None:
                self._client = httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20,
                                            trust_env=False)
            return self._client.request(method, url, **kw)
        return self.net["client"].call(go)

    def url(self, sched: str) -> str:
        return f"http://{self.net[sched].ip}:8470"

    def role(self, sched: str) -> str | None:
        try:
            return self.http("GET", self.url(sched) + "/v1/health", timeout=2).json()["role"]
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            return None

    def leader(self) -> str:
        return wait_for(lambda: next((s for s in self.schedulers if self.role(s) == "leader"), None),
                        30, "a leader scheduler")

    def nodes(self, sched: str) -> dict[str, str]:
        """Executor id -> published address, as the scheduler ``sched`` sees them."""
        items = self.http("GET", self.url(sched) + "/v1/nodes").json()["items"]
        return {n["node"]: n["address"] for n in items}

    def executor_stats(self) -> dict[str, dict[str, Any]]:
        """Each executor's published counters (``stats/<node>`` in etcd, read over its JSON API)."""
        import base64

        def b64(s: str) -> str:
            return base64.b64encode(s.encode()).decode()

        prefix = "/triplane/stats/"  # the registry's default key prefix (registry/backend.py)
        body = {"key": b64(prefix), "range_end": b64(prefix[:-1] + "0")}
        r = self.net["client"].call(httpx.post, f"http://{self.net['db'].ip}:2379/v3/kv/range", json=body,
                                    timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        return {base64.b64decode(kv["key"]).decode().removeprefix(prefix):
                json.loads(base64.b64decode(kv["value"])) for kv in r.json().get("kvs", [])}

    # --- processes ---------------------------------------------------------------------------

    def start_scheduler(self, name: str) -> None:
        host = self.net[name]
        ready = self.tmp / f"{name}.ready"
        ready.unlink(missing_ok=True)
        p = host.popen([sys.executable, "-m", "triplane", "scheduler", "--registry", self.etcd.url,
                        "--db", self.pg.admin_url, "--bind", host.ip, "--port", "8470",
                        "--run-dir", str(self.tmp / name), "--token-file", str(self.tmp / "token"),
                        "--secret-file", str(self.tmp / "secret"), "--ready-file", str(ready),
                        "--log-level", "warning",
                        # every job cut over the executor hosts (the layout these tests and
                        # bench/hosts.py study): none kept whole on one host (--whole-s)
                        "--whole-s", "0"], self.tmp / f"{name}.log")
        wait_for(lambda: ready.exists() or p.poll() is not None, 60, f"scheduler {name}")
        assert p.poll() is None, (self.tmp / f"{name}.log").read_text()[-3000:]
        self.schedulers[name] = p

    def start_executor(self, name: str, env: dict[str, str] | None = None) -> None:
        cfg = self.tmp / f"{name}.toml"
        cfg.write_text(f'[cluster]\nregistry = "{self.etcd.url}"\nsecret_file = "{self.tmp / "secret"}"\n'
                       f'log_level = "warning"\n\n[executor]\nbind = "0.0.0.0"\nmemory = "512MiB"\n'
                       f'engines = "numpy"\nname = "{name}"\npacket_port = 7000\ndata_port = 7001\n')
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("TRIPLANE_")}, **(env or {})}
        self.executors[name] = self.net[name].popen(
            [sys.executable, "-m", "triplane", "executor", "--config", str(cfg)],
            self.tmp / f"{name}.log", env=env)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.tmp.glob("*.log")))


def missing() -> str | None:
    """Why the cluster cannot run on this machine, or None."""
    from triplane.metadb.testing import MISSING_REASON, find_pg_bindir
    from triplane.registry.etcd_server import find_etcd_binary

    why = netns.unavailable()
    if why:
        return why
    if find_etcd_binary() is None:
        return "no etcd binary (apt-get install etcd-server)"
    if find_pg_bindir() is None:
        return MISSING_REASON
    return None


@contextlib.contextmanager
def running(tmp: Path, *, schedulers: Sequence[str] = ("sched-a", "sched-b"),
            executors: Sequence[str] = tuple(EXECUTORS), bound_s: float = 280.0,
            executor_env: dict[str, str] | None = None) -> Iterator[MultiHost]:
    """The cluster up (every executor registered), then everything removed."""
    from triplane.metadb.testing import PostgresServer, find_pg_bindir
    from triplane.registry.etcd_server import EtcdServer

    bindir = find_pg_bindir()
    assert bindir is not None, "call missing() first"
    tmp.chmod(0o755)
    (tmp / "token").write_text(TOKEN)
    (tmp / "secret").write_text(SECRET)
    for f in ("token", "secret"):
        (tmp / f).chmod(0o600)
    net = netns.Network(HOSTS)
    c = MultiHost(net, tmp)
    watchdog = threading.Timer(bound_s, net.close)
    watchdog.daemon = True
    watchdog.start()
    try:
        net.start()
        db = net["db"]
        c.pg = PostgresServer(bindir, host=db.ip, port=5432, trust_network=f"{netns.SUBNET}.0/24")
        db.call(c.pg.start)
        c.etcd = EtcdServer(tmp / "etcd", host=db.ip, client_port=2379, peer_port=2380)
        db.call(c.etcd.start)
        for name in schedulers:
            c.start_scheduler(name)
        for name in executors:
            c.start_executor(name, executor_env)
        wait_for(lambda: len(c.nodes(schedulers[0])) == len(executors), 60, "every executor to register")
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        watchdog.cancel()
        if c._client is not None:
            c.net["client"].call(c._client.close)
        if c.pg is not None:
            c.pg.stop()
        if c.etcd is not None:
            c.etcd.stop()
        net.close()
