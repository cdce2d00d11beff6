"""bench/train.py runs end to end on tiny models: every system's row has numbers, the
systems agree on the loss (same weights, same batches), the cluster row ran compiled steps,
and the table and JSON are written. A real LocalCluster of 2 executors on loopback."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import benchrun
import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "train.py"
TINY = ["--small", "64-16-10:32", "--large", "32-24-10:16", "--steps", "4", "--large-steps", "3",
        "--repeats", "2", "--warmup", "2"]


def test_train_bench_tiny(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="the small model trains on scikit-learn's digits")
    proc = benchrun.run_bench(SCRIPT, TINY, tmp_path, timeout=60)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    payload = json.loads((tmp_path / "results" / "train.json").read_text())
    table = (tmp_path / "results" / "train.md").read_text()
    systems = {"numpy", "inprocess", "cluster"} | ({"torch"} if importlib.util.find_spec("torch") else set())
    for model in ("small", "large"):
        rows = {r["system"]: r for r in payload["rows"] if r["model"] == model}
        assert set(rows) == systems
        for row in rows.values():
            assert row["status"] == "ok", row
            assert len(row["ms"]) == 2 and all(ms > 0 for ms in row["ms"]), row
        losses = [r["loss"] for r in rows.values()]
        assert max(losses) - min(losses) < 1e-3 * max(1.0, abs(losses[0])), losses
        # after Adam's first two steps every step is the same structure: compiled steps
        assert rows["inprocess"]["stats"]["trace_hits"] >= 6, rows["inprocess"]["stats"]
        assert rows["cluster"]["stats"]["trace_hits"] >= 6, rows["cluster"]["stats"]
    assert "triplane in-process" in table and "Targets (issue 12)" in table
    assert "x PyTorch" in table
