"""``triplane up`` / ``status --json`` / ``down`` as real subprocesses with TRIPLANE_HOME in
tmp_path; ``tp.connect()`` with no arguments finds the run directory; a second ``up`` is
refused while the first cluster lives; ``down`` is idempotent and leaves no process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import triplane as tp
from triplane.launcher import down as stop_cluster
from triplane.launcher.procs import alive
from triplane.registry.http import HttpBackend, RegistryAuthError
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import set_default_session, use_session


def _cli(home: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIPLANE_URL", "TRIPLANE_TOKEN")}
    env.update(TRIPLANE_HOME=str(home), COLUMNS="200", NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "triplane", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A run dir; whatever `up` left running there is stopped at the end, pass or fail."""
    h = tmp_path / "home"
    for var in ("TRIPLANE_URL", "TRIPLANE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRIPLANE_HOME", str(h))
    yield h
    set_default_session(None)
    stop_cluster(h, grace_s=2.0)


def _not_private(home: Path) -> dict[str, str]:
    """Every path under ``home`` that is not 0700 (directories) or 0600 (files)."""
    bad = {}
    for dirpath, dirs, files in os.walk(home):
        for name, want in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
            p = Path(dirpath) / name
            if not p.is_symlink() and p.stat().st_mode & 0o777 != want:
                bad[str(p.relative_to(home))] = oct(p.stat().st_mode & 0o777)
    if home.stat().st_mode & 0o777 != 0o700:
        bad["."] = oct(home.stat().st_mode & 0o777)
    return bad


def test_up_status_connect_down_round_trip(home: Path) -> None:
    # A run dir that existed before, world-readable (issue 11): `up` closes all of it.
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "old.log").write_text("old")
    for p, mode in ((home, 0o755), (home / "logs", 0o755), (home / "logs" / "old.log", 0o644)):
        os.chmod(p, mode)
    t0 = time.monotonic()
    r = _cli(home, "up", "--executors", "2", "--memory", "128MiB", "--keep-jobs", "500", "--engines", "auto")
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads((home / "cluster.json").read_text())
    argv = Path(f"/proc/{info['scheduler']['pid']}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--keep-jobs") + 1] == b"500"  # the metadb's retention bound
    for e in info["executors"]:  # --engines reaches every executor; no GPU asked, none given
        argv = Path(f"/proc/{e['pid']}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"--engines") + 1] == b"auto" and b"--memory-engine" not in argv
    token = (home / "token").read_text().strip()
    assert info["url"] in r.stdout and token not in r.stdout and "--show-token" in r.stdout
    for f in ("token", "secret", "cluster.json"):
        assert (home / f).stat().st_mode & 0o777 == 0o600, f
    assert _not_private(home) == {}
    pids = [info["scheduler"]["pid"], *(e["pid"] for e in info["executors"])]
    assert len(pids) == 3 and all(alive(p) for p in pids)
    assert (home / "logs" / "scheduler.log").exists() and (home / "logs" / "executor-1.log").exists()
    up_s = time.monotonic() - t0

    again = _cli(home, "up")
    assert again.returncode == 1 and "already running" in again.stdout and "triplane down" in again.stdout

    session = tp.connect()  # no arguments: found through TRIPLANE_HOME
    assert session.url == info["url"]
    x = tp.Tensor.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal((x @ tp.transpose(x)).numpy(), [[5, 14], [14, 50]])
    job = session.last_job
    set_default_session(None)
    assert any((home / "tensors").iterdir()) and _not_private(home) == {}  # uploads, metadb, logs

    # Client tokens with roles, added while the cluster runs.
    alice = _cli(home, "tokens", "add", "alice", "--role", "submit").stdout.strip()
    viewer = _cli(home, "tokens", "add", "viewer", "--role", "read").stdout.strip()
    with RemoteSession(info["url"], alice) as mine, use_session(mine):
        np.testing.assert_array_equal((x + 1).numpy(), [[1, 2, 3], [4, 5, 6]])
        alices_job = mine.last_job
    with RemoteSession(info["url"], viewer) as read_only, use_session(read_only), \
            pytest.raises(tp.TriplaneError, match="403"):
        (x * 2).numpy()
    listed = httpx.get(f"{info['url']}/v1/jobs", headers={"Authorization": f"Bearer {alice}"}).json()["items"]
    assert [j["id"] for j in listed] == [alices_job]

    # Issue 11's poisoning attempt on a real cluster: the admin token cannot re-point
    # scheduler/data (where executors pull uploads from) at a fake server; jobs stay right.
    async def poison() -> None:
        async with HttpBackend(info["url"], token) as reg:
            await reg.put("scheduler/data", b'{"address": "127.0.0.1", "data_port": 9}')
    with pytest.raises(RegistryAuthError, match="403"):
        asyncio.run(poison())
    with RemoteSession(info["url"], token) as admin, use_session(admin):
        y = tp.Tensor.from_array(np.array([0, 1, 2, 3], dtype=np.float32))
        np.testing.assert_array_equal((y + 1).numpy(), [1, 2, 3, 4])

    st = _cli(home, "status", "--json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["running"] and status["url"] == info["url"] and status["error"] is None
    assert sorted(n["pid"] for n in status["nodes"]) == sorted(pids[1:])
    for n in status["nodes"]:
        assert n["id"].startswith("executor-") and n["address"].startswith("127.0.0.1:")
        assert n["health"] == "up" and any("numpy" in e for e in n["engines"])
    assert [j["state"] for j in status["jobs"] if j["id"] == job] == ["done"]
    table = _cli(home, "status")
    assert table.returncode == 0 and "executor-0" in table.stdout and job in table.stdout

    d = _cli(home, "down")
    assert d.returncode == 0 and "stopped" in d.stdout
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)
    assert not (home / "cluster.json").exists()
    assert "no cluster was running" in _cli(home, "down").stdout  # idempotent
    gone = _cli(home, "status", "--json")
    assert gone.returncode == 1 and json.loads(gone.stdout)["running"] is False
    print(f"triplane up (scheduler + 2 executors) ready in {up_s:.1f} s")


def test_status_and_connect_with_nothing_running(home: Path) -> None:
    r = _cli(home, "status")
    assert r.returncode == 1 and "triplane up" in r.stdout
    with pytest.raises(tp.TriplaneError, match="triplane up"):
        tp.connect()


def test_bad_options_fail_before_starting_anything(home: Path) -> None:
    r = _cli(home, "up", "--executors", "1", "--memory", "lots")
    assert r.returncode == 1 and "bad memory size 'lots'" in r.stdout
    assert not (home / "cluster.json").exists() and not _pids_of(home)
    r = _cli(home, "up", "--etcd", "zookeeper://x")
    assert r.returncode == 1 and "etcd://HOST:PORT" in r.stdout
    r = _cli(home, "up", "--engines", "numpy,nosuch")
    assert r.returncode == 1 and "unknown op engine 'nosuch'" in r.stdout and "'numpy'" in r.stdout
    r = _cli(home, "up", "--gpus", "3", "--executors", "2")
    assert r.returncode == 1 and "--gpus 3 needs at least 3 executors" in r.stdout
    assert not (home / "cluster.json").exists() and not _pids_of(home)


def test_gpus_where_cupy_or_a_gpu_is_missing_fail_in_one_line_naming_it(home: Path) -> None:
    from triplane.engines.op.cupy_engine import gpu_available

    ok, why = gpu_available()
    if ok:
        pytest.skip("this machine has cupy and a GPU: nothing is missing")
    missing = "cupy is not installed" if "not installed" in why else "cupy finds no"
    for args, what in ((["--gpus", "1"], "--gpus 1"), (["--engines", "cupy", "--executors", "1"],
                                                       "--engines cupy")):
        r = _cli(home, "up", *args)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"triplane up failed: {what} needs cupy and a GPU: {missing}" in r.stdout, r.stdout
        assert "Traceback" not in r.stdout + r.stderr
    assert not (home / "cluster.json").exists() and not _pids_of(home)


def test_a_failing_executor_makes_start_fail_clearly_and_stop_everything(home: Path) -> None:
    from triplane.launcher import ClusterConfig, LaunchError, LocalCluster

    # an impossible fault-injection probability: the executor exits at once with a usage error
    cluster = LocalCluster(home, ClusterConfig(executors=1, memory="64MiB", ready_timeout_s=30,
                                               executor_args=["--drop-udp", "5"]))
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        cluster.start()
    msg = str(info.value)
    assert "executor-0 exited with code 2" in msg and "--drop-udp" in msg and str(home / "logs") in msg
    assert time.monotonic() - t0 < 30
    assert not (home / "cluster.json").exists()
    assert not cluster.scheduler.running()  # the scheduler it had started was stopped again
    deadline = time.monotonic() + 5
    while _pids_of(home) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pids_of(home)


def _pids_of(home: Path) -> list[str]:
    """Pids of live processes whose command line mentions this run dir (none should be left)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and alive(int(d.name)):
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if str(home).encode() in cmd:
                out.append(d.name)
    return out
