"""bench/serve.py runs end to end with a small N: real processes on loopback (a local
cluster of 2, `triplane serve`), over HTTP and gRPC, every request answered, both
executors running batches, the reload row answered by both
versions, the executor SIGKILLed without a failed request; a hard time bound."""

from __future__ import annotations

import json
from pathlib import Path

import benchrun

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "serve.py"


def test_the_serving_benchmark_runs_small(tmp_path: Path) -> None:
    r = benchrun.run_bench(SCRIPT, ["--requests", "24", "--clients", "1,4", "--time-limit-s", "40"], tmp_path,
                           timeout=240)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    result = json.loads((tmp_path / "results" / "serve.json").read_text())
    assert [(row["batching"], row["protocol"], row["clients"]) for row in result["rows"]] == [
        (b, p, n) for b in (True, False) for p in ("http", "grpc") for n in (1, 4)]
    for row in result["rows"] + result["chaos"]:
        assert row["errors"] == [] and row["ok"] >= 24, row
    for row in result["rows"]:  # the 2 replicas prefer one executor each: both run batches
        assert len(row["tasks_by_node"]) == 2 and min(row["tasks_by_node"].values()) > 0, row
    reload, kill = result["chaos"]
    assert reload["event"] == "reload" and len(reload["versions"]) == 2, reload
    assert kill["event"] == "executor SIGKILLed"
    table = (tmp_path / "results" / "serve.md").read_text()
    assert "| grpc     | yes      |       4 |" in table and "executor SIGKILLed" in table
