"""The lifecycle of remote values on a real local cluster (issue 12, "a tensor lifecycle"
and "interrupts"): results released once read keep executor memory flat over a loop of
jobs; uploads' files go when their tensors die; ``disconnect`` releases what a session
holds; a SIGKILLed client has its values freed once its lease expires; SIGINT during a
long ``.numpy()`` cancels the job; ``triplane cancel JOB`` cancels one.

Executor memory is read from ``GET /v1/nodes`` (``memory.free``, which executors publish
every second)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_memory import free_bytes, settled_free
from cluster_run import running_cluster

import triplane as tp
from triplane.launcher import LocalCluster
from triplane.sdk.remote import RemoteError, RemoteSession
from triplane.sdk.session import use_session

TTL_S = 2.0
MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("lifecycle"), bound_s=900.0, executors=2,
                         scheduler_args=["--session-ttl", f"{TTL_S:g}"]) as c:
        yield c


def api(c: LocalCluster) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.token}"}, timeout=10.0)


def upload_files(c: LocalCluster) -> set[str]:
    return {p.name for p in (Path(c.run.path) / "tensors").glob("u-*.npy")}


def big_result(i: int) -> tp.Tensor:
    return tp.ones((2048, 4096)) * float(i)  # 32 MiB of float32, made on the executors


def long_job() -> tp.Tensor:
    tp.manual_seed(0)
    x, w = tp.randn((1536, 1536)), tp.randn((1536, 1536)) * 0.02
    for _ in range(120):
        x = tp.tanh(x @ w)
    return x.sum()


def test_results_released_once_read_keep_executor_memory_flat(cluster: LocalCluster) -> None:
    base = settled_free(cluster)
    frees = []
    with RemoteSession(cluster.url, cluster.token, poll_s=1.0) as s, use_session(s):
        # 640 MiB of results in all, 512 MiB of executor memory: without the releases the
        # loop itself fails with "memory full" (as 30 jobs of 64 MiB did on 2 x 1 GiB).
        for i in range(20):
            assert float(big_result(i).numpy()[0, 0]) == float(i)
            if i % 5 == 4:
                frees.append(free_bytes(cluster))
        s.keeper.flush()
        frees.append(settled_free(cluster, base))
    print(f"\nexecutor free bytes: {base} before, {frees} during and after 20 jobs of 32 MiB")
    assert frees[-1] == base


def test_unreleased_results_are_freed_by_disconnect(cluster: LocalCluster) -> None:
    """The contrast: a session that does not release (``release=False``) holds every
    result until it ends; ending it releases them all (what the lease does for a dead
    client, and ``tp.disconnect()`` for a live one)."""
    base = settled_free(cluster)
    s = RemoteSession(cluster.url, cluster.token, poll_s=1.0, release=False)
    with use_session(s):
        for i in range(4):
            big_result(i).numpy()
    held = settled_free(cluster)
    assert base - held >= 4 * 32 * MIB
    s.close()  # what tp.disconnect() and process exit do
    assert settled_free(cluster, base) == base


def test_an_upload_is_deleted_from_disk_when_its_tensor_dies(cluster: LocalCluster) -> None:
    import numpy as np

    before = upload_files(cluster)
    with RemoteSession(cluster.url, cluster.token, poll_s=1.0) as s, use_session(s):
        t = tp.Tensor.from_array(np.arange(1 << 16, dtype=np.float32))
        (t + 1).sum().numpy()
        new = upload_files(cluster) - before
        assert len(new) == 1
        del t
        gc.collect()
        s.keeper.flush()
        assert upload_files(cluster) - before == set()


def test_disconnect_releases_the_uploads_it_holds(cluster: LocalCluster) -> None:
    import numpy as np

    before = upload_files(cluster)
    s = tp.connect(cluster.url, cluster.token, poll_s=1.0)
    try:
        # three shapes: three graph submits, each uploading its tensor (one structure would
        # be a compiled step after the first, its input inline and released with its job)
        kept = [tp.Tensor.from_array(np.full(1000 + i, i, np.float32)) for i in range(3)]
        assert [float((k * 2).sum().numpy()) for k in kept] == [0.0, 2002.0, 4008.0]
        assert len(upload_files(cluster) - before) == 3
        tp.disconnect()
        assert upload_files(cluster) - before == set()
    finally:
        tp.disconnect()
        s.close()


def _child(cluster: LocalCluster, body: str) -> subprocess.Popen[str]:
    script = textwrap.dedent(f"""
        import sys, time
        import numpy as np
        import triplane as tp
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        tp.set_progress(False)
        s = tp.connect({cluster.url!r}, {cluster.token!r}, poll_s=1.0)
    """) + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def test_a_killed_client_has_its_values_freed_after_its_lease(cluster: LocalCluster) -> None:
    before, base = upload_files(cluster), settled_free(cluster)
    child = _child(cluster, """
        s.release_values = False  # hold the job's results as well
        t = tp.Tensor.from_array(np.ones((1024, 1024), np.float32))
        (tp.ones((2048, 4096)) * 1.0 + t.sum()).numpy()
        print("ready", flush=True)
        time.sleep(600)
    """)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
        assert len(upload_files(cluster) - before) == 1
        assert base - settled_free(cluster) >= 32 * MIB
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        t0 = time.monotonic()
        freed = settled_free(cluster, base, timeout_s=TTL_S + 15.0)
        print(f"\nfreed {freed - (base - 32 * MIB)} bytes {time.monotonic() - t0:.1f} s after SIGKILL "
              f"(lease TTL {TTL_S:g} s)")
        assert freed == base
        assert upload_files(cluster) - before == set()
    finally:
        child.kill()
        child.wait(10)


def _running_job(cluster: LocalCluster, timeout_s: float = 30.0) -> dict[str, Any]:
    end = time.monotonic() + timeout_s
    with api(cluster) as client:
        while time.monotonic() < end:
            for j in client.get("/v1/jobs", params={"limit": 5}).json()["items"]:
                p = j.get("progress") or {}
                if j["state"] == "running" and p.get("done", 0) >= 1:
                    return j
            time.sleep(0.1)
    raise AssertionError("no job started running")


def _no_task_running(cluster: LocalCluster, job: str) -> None:
    end = time.monotonic() + 10.0
    with api(cluster) as client:
        while time.monotonic() < end:
            state = client.get(f"/v1/jobs/{job}").json()["state"]
            running = [n["running"] for n in client.get("/v1/nodes").json()["items"]]
            if state == "cancelled" and not any(running):
                return
            time.sleep(0.1)
        raise AssertionError(f"job {job} is {state}; tasks running per node: {running}")


def test_sigint_during_numpy_cancels_the_job(cluster: LocalCluster) -> None:
    base = settled_free(cluster)
    child = _child(cluster, """
        from test_cluster_lifecycle import long_job
        try:
            long_job().numpy()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise
    """)
    try:
        job = _running_job(cluster)
        total = job["progress"]["total"]
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        child.kill()
    assert "interrupted" in out
    # a plain KeyboardInterrupt: the user's line and the SDK's few frames, no transport
    assert "site-packages" not in err and "httpcore" not in err and len(err.splitlines()) < 16, err
    assert err.strip().endswith("KeyboardInterrupt"), err
    _no_task_running(cluster, job["id"])
    with api(cluster) as client:
        done = client.get(f"/v1/jobs/{job['id']}").json()["progress"]["done"]
    assert done < total
    # tiles of tasks still running at the cancel are deleted once they are stored
    assert settled_free(cluster, base, timeout_s=20.0) == base


def test_triplane_cancel_cancels_a_running_job(cluster: LocalCluster) -> None:
    from typer.testing import CliRunner

    from triplane.cli import app

    base = settled_free(cluster)
    failure: list[BaseException] = []

    def run() -> None:
        s = RemoteSession(cluster.url, cluster.token, poll_s=0.5)
        try:
            with use_session(s):
                long_job().numpy()
        except BaseException as e:
            failure.append(e)
        finally:
            s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    job = _running_job(cluster)["id"]
    r = CliRunner().invoke(app, ["cancel", job, "--home", str(cluster.run.path)])
    assert r.exit_code == 0, r.output
    assert f"job {job}: cancelled" in r.output
    t.join(20)
    assert failure and isinstance(failure[0], RemoteError) and "cancelled" in str(failure[0])
    _no_task_running(cluster, job)
    assert settled_free(cluster, base, timeout_s=20.0) == base
    r = CliRunner().invoke(app, ["cancel", "j0000000000000000", "--home", str(cluster.run.path)])
    assert r.exit_code == 1 and "404" in r.output


def test_a_long_job_shows_a_progress_bar_on_a_terminal(cluster: LocalCluster) -> None:
    import pty
    import re

    master, slave = pty.openpty()
    script = textwrap.dedent(f"""
        import triplane as tp
        from triplane.sdk import lifecycle
        lifecycle.DELAY_S = 0.2  # the one-second threshold is unit-tested; not its timing here
        tp.connect({cluster.url!r}, {cluster.token!r})
        tp.manual_seed(0)
        x, w = tp.randn((512, 512)), tp.randn((512, 512)) * 0.04
        for _ in range(60):
            x = tp.tanh(x @ w)
        x.sum().numpy()
        tp.set_progress(False)
        x.sum().numpy()
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stderr=slave, stdout=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}, cwd=ROOT)
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        code = child.wait(60)
    finally:
        child.kill()
        os.close(master)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert code == 0, shown[-3000:]
    assert re.search(r"job j[0-9a-f]+ .* \d+/\d+ tasks [\d.]+/s", shown), shown[-2000:]
    assert len(set(re.findall(r"job (j[0-9a-f]+)", shown))) == 1  # not after set_progress(False)
