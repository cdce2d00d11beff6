"""The Go SDK's own checks, run by pytest: `go vet`, `gofmt -l` and `go test -race ./...`
in sdk/go with a live local cluster's URL set (so the Go tests that need one run instead
of skipping), the op-table coverage the Go tests report, and examples/mlp training the
digits MLP on the cluster with a falling loss."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

from sdk_tools import GO_SDK, ROOT, go_env, run_go, write_digits

from triplane.launcher import LocalCluster


def test_go_vet_and_gofmt_are_clean(go: str, tmp_path: Path) -> None:
    vet = run_go(go, "vet", "./...", env=go_env(tmp_path))
    assert vet.returncode == 0, vet.stdout + vet.stderr
    gofmt = shutil.which("gofmt") or str(Path(go).with_name("gofmt"))
    fmt = subprocess.run([gofmt, "-l", "."], cwd=GO_SDK, capture_output=True, text=True, timeout=120)
    assert fmt.returncode == 0 and fmt.stdout == "", f"gofmt -l lists: {fmt.stdout}{fmt.stderr}"


def test_go_tests_pass_with_the_race_detector_against_a_live_cluster(go: str, cluster: LocalCluster,
                                                                      tmp_path: Path) -> None:
    env = go_env(tmp_path, TRIPLANE_TEST_URL=cluster.url, TRIPLANE_TEST_TOKEN=cluster.token or "")
    r = run_go(go, "test", "-race", "-count=1", "-v", "./...", env=env, timeout=540.0)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    # the live tests ran (none skipped), and the op table's coverage is reported in full
    for name in ("TestLiveRefusedToken", "TestLiveJobFailingOnTheClusterNamesTheNode",
                 "TestLiveCancelledContextCancelsTheJob", "TestLiveServerShapeErrorNamesNodeAndLoc",
                 "TestUnreachableSchedulerFailsWithinTheRetryBound", "TestShapeVectors",
                 "TestGoldenGraphsAreByteIdentical", "TestOpTableCoverage", "TestGeneratedOpsAreCurrent"):
        assert f"--- PASS: {name} " in out, f"{name} did not pass:\n{out[-4000:]}"
    assert "--- SKIP" not in out, out[-4000:]
    m = re.search(r"op table coverage: (\d+) of (\d+) ops .*missing: \[(.*)\]", out)
    assert m, out[-3000:]
    ops = json.loads((ROOT / "proto" / "ops.json").read_text())["ops"]
    assert int(m.group(1)) == int(m.group(2)) == len(ops) and m.group(3) == "", m.group(0)
    print(m.group(0))


def test_the_go_mlp_example_trains_digits_with_a_falling_loss(go: str, cluster: LocalCluster,
                                                              tmp_path: Path) -> None:
    data = write_digits(tmp_path / "digits")
    env = go_env(tmp_path, TRIPLANE_URL=cluster.url, TRIPLANE_TOKEN=cluster.token or "")
    r = run_go(go, "run", "./examples/mlp", "-data", str(data), "-steps", "8", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(v) for v in re.findall(r"^step \d+ loss ([0-9.]+)$", r.stdout, re.M)]
    assert len(losses) == 8, r.stdout
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.85 * losses[0], losses
    print(r.stdout)
