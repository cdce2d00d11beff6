"""A local cluster: one scheduler, N executors and optionally an etcd, as background processes.

:class:`LocalCluster` is what ``triplane up`` / ``down``, ``triplane demo`` and the
cluster tests use. ``start()`` returns only when the scheduler answers and every executor
it started is registered; on any failure it stops what it started and raises
:class:`LaunchError` quoting the failing process's log. The processes run in their own
sessions, so they outlive the Python process that started them (``up`` exits and leaves
them running; ``down`` stops them from the pids in ``cluster.json``).

Registry choices (``etcd``):

* ``None`` (default): the scheduler owns an in-memory registry (``memory://``) and serves
  it; executors reach it as ``http://<scheduler>`` with the node credential (derived from
  the cluster secret; client tokens cannot use the registry).
* ``"embedded"``: a private etcd in the run directory, managed (and stopped) with the rest.
* ``"etcd://host:port"``: an existing etcd, not managed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triplane.launcher.gpus import (
    GpuUnavailable,
    check_engines,
    check_gpus,
    check_network_engine,
    executor_engines,
)
from triplane.launcher.procs import is_ours, log_tail, spawn, stop_pids, triplane_argv
from triplane.launcher.rundir import RunDir

__all__ = ["ClusterConfig", "LaunchError", "LocalCluster"]


_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


class LaunchError(RuntimeError):
    """The cluster could not be started (or is already running); the message says why
    and where the logs are."""


@dataclass
class ClusterConfig:
    """What to start. ``memory`` is each executor's tile capacity (e.g. ``"1GiB"``);
    ``port`` 0 picks a free one; ``grpc_port`` is the scheduler's gRPC port (docs/grpc.md;
    0: a free one, None: no gRPC); ``executor_args`` / ``scheduler_args`` are appended to
    every executor's / the scheduler's command line (e.g. ``["--drop-udp", "0.2"]``).
    ``engines`` is every executor's ``--engines`` (default numpy; cupy and numpy on a GPU
    executor); ``gpus`` N gives the first N executors one GPU each (launcher/gpus.py);
    ``network_engine`` is the one every executor measures its links with (default tcp)."""

    executors: int = 2
    etcd: str | None = None
    db: str | None = None
    memory: str = "1GiB"
    host: str = "127.0.0.1"
    port: int = 0
    grpc_port: int | None = 0
    engines: str | None = None
    gpus: int = 0
    network_engine: str | None = None
    executor_args: list[str] = field(default_factory=list)
    scheduler_args: list[str] = field(default_factory=list)
    ready_timeout_s: float = 60.0
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 0 <= self.executors <= 64:
            raise ValueError(f"executors must be between 0 and 64, got {self.executors}")
        if self.etcd is not None and self.etcd != "embedded" and not self.etcd.startswith("etcd://"):
            raise ValueError(f"--etcd must be 'embedded' or etcd://HOST:PORT, got {self.etcd!r}")
        from triplane.executor.config import parse_size

        parse_size(self.memory)  # a bad size fails here, not in N executor logs
        check_engines(self.engines)
        check_network_engine(self.network_engine)
        if self.gpus < 0:
            raise ValueError(f"--gpus must be 0 or more, got {self.gpus}")
        if self.gpus > self.executors:
            raise ValueError(f"--gpus {self.gpus} needs at least {self.gpus} executors (one per GPU), "
                             f"--executors is {self.executors}")


@dataclass
class _Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    expected_exit: bool = False  # killed on purpose (chaos tests): not a launch failure

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen is not None else 0

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class LocalCluster:
    """Processes of one run directory. Use ``with LocalCluster(home, cfg) as c:`` in
    tests so everything is stopped even when the test fails."""

    def __init__(self, home: str | os.PathLike[str] | None = None, config: ClusterConfig | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.run = RunDir(home)
        self.config = config or ClusterConfig()
        self.env = {**os.environ, **(env or {}), "TRIPLANE_HOME": str(self.run.path)}
        self.url = ""
        self.grpc = ""  # host:port of the scheduler's gRPC service ("" when not served)
        self.token = ""
        self.registry = ""
        self.db = ""
        self.scheduler: _Proc | None = None
        self.executors: list[_Proc] = []
        self.etcd: Any = None  # triplane.registry.etcd_server.EtcdServer when embedded
        self._next_executor = 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Start everything, wait until ready, write ``cluster.json``; returns its content.
        Raises :class:`LaunchError` (after stopping what it started) on failure, or when a
        cluster recorded in this run directory is still alive."""
        with self.run.locked():
            running = live_cluster(self.run)
            if running is not None:
                raise LaunchError(f"a cluster is already running from {self.run.path} "
                                  f"({running['url']}); stop it with `triplane down` first")
            try:  # before any process starts: what is missing, in one line
                check_gpus(self.config.gpus, self.config.engines)
            except GpuUnavailable as e:
                raise LaunchError(str(e)) from None
            self.run.create()
            self.token, _ = self.run.new_secrets()
            try:
                self._start_all()
                info = self.info()
                self.run.write_cluster(info)
                self.run.secure()  # what the processes (and a managed etcd) created meanwhile
            except BaseException:
                self.stop()
                raise
        return info

    def _start_all(self) -> None:
        cfg = self.config
        if cfg.etcd == "embedded":
            from triplane.registry.etcd_server import EtcdServer

            try:
                self.etcd = EtcdServer(self.run.etcd_data)
                self.etcd.start()
            except (OSError, RuntimeError, TimeoutError) as e:
                raise LaunchError(f"could not start the embedded etcd: {e}") from None
            self.registry = self.etcd.url
        else:
            self.registry = cfg.etcd or "memory://"
        self.db = cfg.db or f"sqlite:///{self.run.path / 'metadb.sqlite3'}"
        self.scheduler = _Proc("scheduler", self._scheduler_argv(cfg.port, cfg.grpc_port),
                               self.run.log("scheduler"))
        self.scheduler.popen = spawn(self.scheduler.argv, self.scheduler.log, self.env)
        self._wait_scheduler()
        # A restart must come back on the same ports (clients and executors keep the URL).
        self.scheduler.argv = self._scheduler_argv(int(self.url.rsplit(":", 1)[1]),
                                                   int(self.grpc.rsplit(":", 1)[1]) if self.grpc else None)
        for _ in range(cfg.executors):
            self.add_executor(wait=False)
        self.wait_ready()

    def _scheduler_argv(self, port: int, grpc_port: int | None) -> list[str]:
        cfg = self.config
        grpc = ["--grpc-port", str(grpc_port)] if grpc_port is not None else []
        return triplane_argv("scheduler", "--registry", self.registry, "--db", self.db,
                             "--host", cfg.host, "--port", str(port), "--run-dir", str(self.run.path),
                             "--token-file", str(self.run.token_file),
                             "--tokens-file", str(self.run.tokens_file),
                             "--secret-file", str(self.run.secret_file),
                             "--ready-file", str(self.ready_file),
                             "--log-level", cfg.log_level, *grpc, *cfg.scheduler_args)

    @property
    def ready_file(self) -> Path:
        """Where the scheduler writes its URL once it serves (so port 0 needs no guessing)."""
        return self.run.path / "scheduler.ready"

    @property
    def executor_registry(self) -> str:
        """The registry URL as executors see it (the served one for ``memory://``)."""
        return self.url if self.registry.startswith("memory://") else self.registry

    def add_executor(self, wait: bool = True, extra_args: list[str] | None = None) -> _Proc:
        """Start one more executor (named ``executor-<i>``); with ``wait``, until registered."""
        i = self._next_executor
        self._next_executor += 1
        name = f"executor-{i}"
        argv, gpu_env = self.executor_argv(i)
        argv += extra_args or []
        proc = _Proc(name, argv, self.run.log(name))
        proc.popen = spawn(argv, proc.log, {**self.env, **self._blas_env(), **gpu_env})
        self.executors.append(proc)
        if wait:
            self.wait_ready()
        return proc

    def executor_argv(self, i: int) -> tuple[list[str], dict[str, str]]:
        """Executor ``i``'s command line and what it adds to the environment (a GPU
        executor's ``CUDA_VISIBLE_DEVICES``)."""
        cfg = self.config
        engines, gpu_args, gpu_env = executor_engines(i, cfg.gpus, cfg.engines, self.env)
        argv = triplane_argv("executor", "--registry", self.executor_registry, "--engines", engines,
                             "--memory", cfg.memory, "--host", cfg.host, "--name", f"executor-{i}",
                             "--secret-file", str(self.run.secret_file),
                             "--log-level", cfg.log_level, *gpu_args,
                             *(["--network-engine", cfg.network_engine] if cfg.network_engine else []),
                             *cfg.executor_args)
        return argv, gpu_env

    def _blas_env(self) -> dict[str, str]:
        """BLAS threads per executor: the host's cores shared among the executors started on
        it (N executors each with BLAS's default of one thread per core would oversubscribe
        the cores N times). A value the user set wins."""
        if any(v in self.env for v in _BLAS_VARS):
            return {}
        threads = str(max(1, (os.cpu_count() or 1) // max(1, self.config.executors)))
        return {v: threads for v in _BLAS_VARS}

    def kill_executor(self, i: int, sig: int = 9) -> int:
        """Send ``sig`` (default SIGKILL) to executor ``i`` and reap it; its pid."""
        p = self.executors[i]
        assert p.popen is not None
        p.expected_exit = True
        p.popen.send_signal(sig)
        p.popen.wait(10)
        return p.pid

    def restart_scheduler(self, *, kill: bool = True) -> None:
        """Stop the scheduler (SIGKILL, or SIGTERM with ``kill=False``) and start it again on
        the same port and database, as after a crash; returns when it answers again."""
        assert self.scheduler is not None and self.scheduler.popen is not None
        if kill:
            self.scheduler.popen.kill()
            self.scheduler.popen.wait(10)
        else:
            stop_pids([self.scheduler.pid], grace_s=10, children=[self.scheduler.popen])
        self.scheduler.popen = spawn(self.scheduler.argv, self.scheduler.log, self.env)
        self._wait_scheduler()
        self._rewrite_info()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every process this object started; idempotent."""
        procs = [p for p in (*self.executors, self.scheduler) if p is not None and p.popen is not None]
        stop_pids([p.pid for p in procs], grace_s, children=[p.popen for p in procs if p.popen])
        if self.etcd is not None:
            self.etcd.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.run.clear_cluster()

    # --- readiness -------------------------------------------------------------------------

    def _fail(self, what: str, proc: _Proc | None) -> LaunchError:
        logs = f"; its log ({proc.log}) ends with:\n{log_tail(proc.log)}" if proc else ""
        return LaunchError(f"{what} (logs in {self.run.logs}){logs}")

    def _wait_scheduler(self) -> None:
        import httpx

        assert self.scheduler is not None
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            if not self.scheduler.running():
                raise self._fail(f"the scheduler exited with code {self.scheduler.popen.returncode}"
                                 if self.scheduler.popen else "the scheduler did not start", self.scheduler)
            ready = self._ready()
            url = ready.get("url") if ready else None
            try:
                if isinstance(url, str) and httpx.get(f"{url}/v1/health", timeout=1.0).status_code == 200:
                    self.url = url
                    self.grpc = str(ready.get("grpc") or "")  # type: ignore[union-attr]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise self._fail(f"the scheduler did not answer within {self.config.ready_timeout_s:g} s",
                         self.scheduler)

    def _ready(self) -> dict[str, Any] | None:
        """The ready file (url, ports, "grpc"), once the scheduler (this one: same pid) wrote
        it whole."""
        try:
            ready = json.loads(self.ready_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(ready, dict) or ready.get("pid") != self.scheduler.pid:  # type: ignore[union-attr]
            return None
        return ready

    def registered(self) -> list[dict[str, Any]]:
        """The nodes the scheduler lists now (``GET /v1/nodes``)."""
        import httpx

        r = httpx.get(f"{self.url}/v1/nodes", params={"limit": 1000},
                      headers={"Authorization": f"Bearer {self.token}"}, timeout=5.0)
        r.raise_for_status()
        return list(r.json()["items"])

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until every running executor started here is registered (by pid)."""
        import httpx

        deadline = time.monotonic() + (timeout_s or self.config.ready_timeout_s)
        while True:
            for p in self.executors:
                if p.popen is not None and p.popen.poll() is not None and not p.expected_exit:
                    raise self._fail(f"{p.name} exited with code {p.popen.returncode}", p)
            want = {p.pid for p in self.executors if p.running()}
            try:
                have = {int(n.get("pid", 0)) for n in self.registered()}
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                have = set()
            if want <= have:
                return
            if time.monotonic() >= deadline:
                missing = [p for p in self.executors if p.running() and p.pid not in have]
                raise self._fail(f"{len(missing)} executor(s) not registered after "
                                 f"{timeout_s or self.config.ready_timeout_s:g} s: "
                                 f"{[p.name for p in missing]}", missing[0] if missing else None)
            time.sleep(0.1)

    # --- the record --------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        from triplane import __version__

        return {
            "url": self.url, "grpc": self.grpc or None, "registry": self.registry,
            "executor_registry": self.executor_registry,
            "db": self.db, "version": __version__, "started": time.time(), "home": str(self.run.path),
            "token_file": str(self.run.token_file), "tokens_file": str(self.run.tokens_file),
            "secret_file": str(self.run.secret_file),
            "scheduler": _proc_info(self.scheduler) if self.scheduler else None,
            "executors": [_proc_info(p) for p in self.executors if p.running()],
            "etcd": ({"pid": self.etcd.proc.pid if self.etcd.proc else 0, "url": self.etcd.url,
                      "log": str(self.etcd.log_path), "data_dir": str(self.etcd.data_dir)}
                     if self.etcd is not None else None),
        }

    def _rewrite_info(self) -> None:
        if self.run.read_cluster() is not None:
            self.run.write_cluster(self.info())


def _proc_info(p: _Proc) -> dict[str, Any]:
    return {"name": p.name, "pid": p.pid, "log": str(p.log), "argv": p.argv}


def recorded_pids(info: dict[str, Any]) -> list[int]:
    """Every pid a ``cluster.json`` names: executors first, the scheduler, then etcd last
    (so nothing loses its registry while still shutting down)."""
    pids = [int(e.get("pid", 0)) for e in info.get("executors") or []]
    for key in ("scheduler", "etcd"):
        if isinstance(info.get(key), dict):
            pids.append(int(info[key].get("pid", 0)))
    return [p for p in pids if p > 0]


def live_cluster(run: RunDir) -> dict[str, Any] | None:
    """The recorded cluster if any of its processes is still alive, else None."""
    info = run.read_cluster()
    if info is None:
        return None
    return info if any(is_ours(p, marker) for p, marker in _markers(info)) else None


def _markers(info: dict[str, Any]) -> list[tuple[int, str]]:
    """(pid, what its command line must contain) of every recorded process; none for a
    record too damaged to name them."""
    try:
        pids = recorded_pids(info)
    except (TypeError, ValueError, AttributeError):
        return []
    etcd_pid = int(info["etcd"].get("pid", 0)) if isinstance(info.get("etcd"), dict) else 0
    return [(p, "etcd" if p == etcd_pid else "triplane") for p in pids]


def stop_recorded(run: RunDir, grace_s: float = 5.0) -> dict[str, Any] | None:
    """Stop every process ``cluster.json`` names and remove the file; the record stopped
    (None if there was none). Idempotent."""
    with run.locked():
        info = run.read_cluster()
        if info is None:
            return None
        markers = _markers(info)
        # triplane processes first, then etcd (stop_pids checks the marker for each).
        stop_pids([p for p, m in markers if m == "triplane"], grace_s)
        stop_pids([p for p, m in markers if m == "etcd"], grace_s, marker="etcd")
        run.clear_cluster()
        return info

