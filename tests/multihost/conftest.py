"""The multi-host cluster: seven hosts on a private bridge (tests/multihost/netns.py).

    db       10.213.0.10  etcd (client port 2379) and PostgreSQL (5432)
    sched-a  10.213.0.11  scheduler (started first: the leader)
    sched-b  10.213.0.12  scheduler (standby)
    exec-1..3 .13-.15     executors, configured by a TOML file, bound to 0.0.0.0 (the
                          address they publish is found from the route to etcd)
    client   10.213.0.16  where the tests' HTTP calls come from

Skipped, with the reason, where namespaces cannot be made (not root) or etcd or the
PostgreSQL server is missing. Every process and namespace is removed at the end, also
when a test fails; a watchdog does it after ``HARD_BOUND_S`` so nothing can hang.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import netns
import pytest

TOKEN = "multihost-token-0123456789abcdef"
SECRET = "multihost-secret-0123456789abcdef"
HARD_BOUND_S = 280.0
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
                        "--log-level", "warning"], self.tmp / f"{name}.log")
        wait_for(lambda: ready.exists() or p.poll() is not None, 60, f"scheduler {name}")
        assert p.poll() is None, (self.tmp / f"{name}.log").read_text()[-3000:]
        self.schedulers[name] = p

    def start_executor(self, name: str) -> None:
        cfg = self.tmp / f"{name}.toml"
        cfg.write_text(f'[cluster]\nregistry = "{self.etcd.url}"\nsecret_file = "{self.tmp / "secret"}"\n'
                       f'log_level = "warning"\n\n[executor]\nbind = "0.0.0.0"\nmemory = "512MiB"\n'
                       f'engines = "numpy"\nname = "{name}"\npacket_port = 7000\ndata_port = 7001\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIPLANE_")}
        self.executors[name] = self.net[name].popen(
            [sys.executable, "-m", "triplane", "executor", "--config", str(cfg)],
            self.tmp / f"{name}.log", env=env)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.tmp.glob("*.log")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    from triplane.metadb.testing import MISSING_REASON, PostgresServer, find_pg_bindir
    from triplane.registry.etcd_server import EtcdServer, find_etcd_binary

    if find_etcd_binary() is None:
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.skip(MISSING_REASON)
    tmp = tmp_path_factory.mktemp("multihost")
    tmp.chmod(0o755)  # the postgres user reads nothing here, but the path must be traversable
    (tmp / "token").write_text(TOKEN)
    (tmp / "secret").write_text(SECRET)
    for f in ("token", "secret"):
        (tmp / f).chmod(0o600)
    net = netns.Network(HOSTS)
    c = MultiHost(net, tmp)
    watchdog = threading.Timer(HARD_BOUND_S, net.close)
    watchdog.daemon = True
    watchdog.start()
    try:
        net.start()
        db = net["db"]
        c.pg = PostgresServer(bindir, host=db.ip, port=5432, trust_network=f"{netns.SUBNET}.0/24")
        db.call(c.pg.start)
        c.etcd = EtcdServer(tmp / "etcd", host=db.ip, client_port=2379, peer_port=2380)
        db.call(c.etcd.start)
        c.start_scheduler("sched-a")
        c.start_scheduler("sched-b")
        for name in EXECUTORS:
            c.start_executor(name)
        wait_for(lambda: len(c.nodes("sched-a")) == 3, 60, "three executors to register")
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        watchdog.cancel()
        if c._client is not None:
            c._client.close()
        if c.pg is not None:
            c.pg.stop()
        if c.etcd is not None:
            c.etcd.stop()
        net.close()
