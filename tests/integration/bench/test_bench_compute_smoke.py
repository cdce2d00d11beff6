"""bench/compute.py runs end to end on small sizes, checks its results, and cleans up.

The triplane and numpy rows run always (a real LocalCluster of 2 executors on loopback, a
numpy child process). Dask and Ray are heavy and optional: set
``TRIPLANE_BENCH_BASELINES=1`` to include them (skipped when not installed). Every run
has a hard time bound; on expiry the benchmark's whole process group is killed. The
OpenBLAS pins are kept (``--keep-blas-env``): tests never change them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import benchrun
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "compute.py"
# A sanity bound, not a target: one AVX-512 core peaks near 2 FMA x 16 lanes x 2 flops x
# 4 GHz = 256 GFLOP/s. Rates beyond it mean a cached or skipped computation.
PEAK_PER_CORE = 300

SMALL = ["--matmul", "256", "--chain", "256", "--mlp", "128x64", "--repeats", "2", "--keep-blas-env"]

sys.path.insert(0, str(REPO / "bench"))
import compute_workloads as cw  # noqa: E402

sys.path.pop(0)


def run_bench(args: list[str], tmp_path: Path, timeout: float,
              keep_home: bool = True) -> subprocess.CompletedProcess[str]:
    return benchrun.run_bench(SCRIPT, args, tmp_path, timeout, keep_home)


def recorded_pids(tmp_path: Path) -> set[int]:
    pids: set[int] = set()
    for f in tmp_path.glob("triplane-bench-*/bench-cluster.json"):
        info = json.loads(f.read_text())
        pids |= {int(e["pid"]) for e in info.get("executors") or []}
        pids.add(int(info["scheduler"]["pid"]))
    return {p for p in pids if p > 1}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def rows_of(tmp_path: Path) -> list[dict]:
    data = json.loads((tmp_path / "results" / "compute.json").read_text())
    assert data["machine"]["nproc"] >= 1 and data["machine"]["python"]
    return data["rows"]


def test_triplane_and_numpy_rows(tmp_path: Path) -> None:
    start = time.monotonic()
    r = run_bench(["--systems", "triplane,numpy", *SMALL], tmp_path, timeout=120)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert elapsed < 60, f"the smoke run took {elapsed:.0f} s"
    rows = rows_of(tmp_path)
    assert {(row["name"], row["details"][0]["workload"]) for row in rows} == {
        (s, w) for s in ("triplane", "numpy") for w in ("matmul 256^2", "chain 256^2", "mlp 128x64")}
    nproc = os.cpu_count() or 1
    for row in rows:
        assert row["status"] == "ok", row  # includes the result check against float64
        assert len(row["seconds"]) == 2 and all(s > 0 for s in row["seconds"]), row
        # Sane rates: positive, and below what this machine could ever do (100 GFLOP/s
        # or GB/s per core is far above a CPU core's peak at these sizes).
        assert all(0 < rate < PEAK_PER_CORE * nproc for rate in row["rates"]), row
    trip = [row for row in rows if row["name"] == "triplane"]
    assert all(row["details"][0]["upload_s"] >= 0 for row in trip)
    md = (tmp_path / "results" / "compute.md").read_text()
    assert "| matmul 256^2 | triplane" in md and "Targets (issue 4)" in md
    assert "OPENBLAS_NUM_THREADS=1" in md  # the executors ran with one BLAS thread
    pids = recorded_pids(tmp_path)
    assert len(pids) == 3, pids  # scheduler + 2 executors were recorded ...
    assert not [p for p in pids if alive(p)], "processes outlived the benchmark"  # ... and are gone


@pytest.mark.skipif(os.environ.get("TRIPLANE_BENCH_BASELINES") != "1",
                    reason="set TRIPLANE_BENCH_BASELINES=1 to run the Dask and Ray rows")
def test_dask_and_ray_rows(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("ray")
    r = run_bench(["--systems", "dask,ray", *SMALL], tmp_path, timeout=180, keep_home=False)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    rows = rows_of(tmp_path)
    status = {(row["name"], row["details"][0]["workload"]): row["status"] for row in rows}
    assert status[("Ray", "mlp 128x64")].startswith("n/a")
    assert all(s == "ok" for k, s in status.items() if k != ("Ray", "mlp 128x64")), status
    nproc = os.cpu_count() or 1
    for row in rows:  # every run computed (no cached results: Dask dedups by graph key)
        assert all(0 < rate < PEAK_PER_CORE * nproc for rate in row["rates"]), row


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    r = run_bench(["--systems", "triplane,spark"], tmp_path, timeout=30)
    assert r.returncode == 2 and "unknown system" in r.stderr
    r = run_bench(["--matmul", "16"], tmp_path, timeout=30)
    assert r.returncode == 2 and "at least" in r.stderr


SMALL_WORKLOADS = [cw.Workload("matmul", 96), cw.Workload("chain", 96), cw.Workload("mlp", 64, 48)]


@pytest.mark.parametrize("w", SMALL_WORKLOADS, ids=lambda w: w.kind)
def test_the_result_check_accepts_float32_and_rejects_wrong_values(w: cw.Workload) -> None:
    v = cw.make_inputs(w)
    ref = cw.reference(w, v)
    got = cw.probes(w, cw.compute(w, v, np))
    assert cw.check(w, got, ref) is None
    for name in got:  # a 1% error in any one probe is caught
        bad = {**got, name: got[name] * 1.01}
        assert cw.check(w, bad, ref) is not None and name in cw.check(w, bad, ref)
    assert "missing" in cw.check(w, {}, ref)
    if w.kind == "mlp":  # a step without the gradient update is caught too
        stale = {**got, "w1_last": v["w1"][-cw.PROBE:, -cw.PROBE:].astype(np.float64)}
        assert cw.check(w, stale, ref) is not None
