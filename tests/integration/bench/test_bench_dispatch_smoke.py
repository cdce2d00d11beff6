"""bench/dispatch.py runs end to end with a small N and cleans up after itself.

The triplane and UDP rows run always (real processes on loopback: `triplane up` with 2
executors, an echo process). Dask and Ray are heavy and optional: set
``TRIPLANE_BENCH_BASELINES=1`` to include them (skipped when not installed).
Every run has a hard time bound; on expiry the benchmark's whole process group is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import benchrun
import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "dispatch.py"


def run_bench(args: list[str], tmp_path: Path, timeout: float,
              keep_home: bool = False) -> subprocess.CompletedProcess[str]:
    return benchrun.run_bench(SCRIPT, args, tmp_path, timeout, keep_home)


def recorded_pids(tmp_path: Path) -> set[int]:
    """The pids the benchmark's `triplane up` recorded (its run dir is kept under TMPDIR)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from dispatch import _pids
    finally:
        sys.path.pop(0)
    pids: set[int] = set()
    for f in tmp_path.glob("triplane-bench-*/bench-cluster.json"):
        pids |= _pids(json.loads(f.read_text()))
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def rows_of(tmp_path: Path) -> dict[str, dict]:
    data = json.loads((tmp_path / "results" / "dispatch.json").read_text())
    assert data["machine"]["nproc"] >= 1 and data["machine"]["python"]
    return {r["name"]: r for r in data["rows"]}


def test_udp_rows(tmp_path: Path) -> None:
    res = run_bench(["--systems", "udp,codec", "--tasks", "300", "--repeats", "2"], tmp_path, timeout=30)
    assert res.returncode == 0, res.stderr
    rows = rows_of(tmp_path)
    for name in ("bare UDP (floor)", "codec + asyncio UDP"):
        row = rows[name]
        assert row["status"] == "ok"
        assert len(row["rates"]) == 2 and all(r > 0 for r in row["rates"])
        # Serial ping-pong: the round trip is the inverse of the rate.
        assert row["best_roundtrip_us"] == pytest.approx(1e6 / row["best_rate"], rel=1e-6)
    # Decoding and signing packets costs something on top of the bare datagram.
    codec, bare = rows["codec + asyncio UDP"], rows["bare UDP (floor)"]
    assert codec["median_roundtrip_us"] > bare["median_roundtrip_us"]
    md = (tmp_path / "results" / "dispatch.md").read_text()
    assert "| bare UDP (floor)" in md and "nproc" in md


def test_triplane_and_udp_small(tmp_path: Path) -> None:
    start = time.monotonic()
    res = run_bench(["--systems", "triplane,udp", "--tasks", "200", "--chain", "20", "--repeats", "1"],
                    tmp_path, timeout=60, keep_home=True)
    try:
        if res.returncode == 2 and "could not start" in res.stderr:
            pytest.fail(f"triplane cluster did not start:\n{res.stderr[-3000:]}")
        assert res.returncode == 0, res.stderr[-3000:]
        rows = rows_of(tmp_path)
        trip = rows["triplane"]
        assert trip["status"] == "ok", trip
        assert trip["rates"][0] > 0 and trip["roundtrips_us"][0] > 0
        d = trip["details"][0]
        assert d["tasks"] == 200 and d["chain"] == 20
        assert 0 < d["submit_s"] <= d["total_s"]
        assert "| triplane" in res.stdout
        assert len(recorded_pids(tmp_path)) >= 3  # scheduler + 2 executors at least
        assert time.monotonic() - start < 60
    finally:
        pids = recorded_pids(tmp_path)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {p for p in pids if alive(p)}
        for p in left:  # never leave our own cluster behind, even when the assertion fails
            os.kill(p, signal.SIGKILL)
    assert not left, f"processes left running after the benchmark: {sorted(left)}"


def test_sigterm_mid_run_stops_the_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "BENCH_KEEP_HOME": "1"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--systems", "triplane", "--tasks", "20000",
                             "--results-dir", str(tmp_path / "results")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 40
        while not list(tmp_path.glob("triplane-bench-*/bench-cluster.json")):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the cluster did not come up within 40 s"
            time.sleep(0.1)
        time.sleep(1.0)  # mid-job
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=40)
        assert proc.returncode == 130, err[-3000:]
        assert "interrupted" in err
        pids = recorded_pids(tmp_path)
        assert len(pids) >= 3
        end = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.1)
        assert not [p for p in pids if alive(p)]
        assert not (tmp_path / "results" / "dispatch.json").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in recorded_pids(tmp_path):
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_exit_code_when_cluster_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import dispatch
    finally:
        sys.path.pop(0)

    # A `triplane` whose `up` fails at once (and whose `down` has nothing to stop).
    fake = "import sys; print('address already in use', file=sys.stderr); sys.exit(1)"
    monkeypatch.setattr(dispatch, "TRIPLANE_CMD", [sys.executable, "-c", fake])
    code = dispatch.main(["--systems", "triplane", "--tasks", "5", "--results-dir", str(tmp_path / "r")])
    assert code == 2
    assert "address already in use" in capsys.readouterr().err  # the launcher's own words
    assert not (tmp_path / "r" / "dispatch.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRIPLANE_BENCH_BASELINES") != "1",
                    reason="Dask/Ray rows are optional: set TRIPLANE_BENCH_BASELINES=1")
def test_dask_and_ray_rows(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("ray")
    res = run_bench(["--systems", "dask,ray", "--tasks", "300", "--chain", "20", "--repeats", "1"],
                    tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = rows_of(tmp_path)
    for name in ("Dask distributed", "Ray"):
        assert rows[name]["status"] == "ok" and rows[name]["best_rate"] > 0
    assert "1.00x" in res.stdout  # Ray's own ratio against itself
