"""bench/serve.py runs end to end with a small N: real processes on loopback (a local
cluster of 2, `triplane serve`), every request answered, the reload row answered by both
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
    assert [(row["batching"], row["clients"]) for row in result["rows"]] == [
        (True, 1), (True, 4), (False, 1), (False, 4)]
    for row in result["rows"] + result["chaos"]:
        assert row["errors"] == [] and row["ok"] >= 24, row
    reload, kill = result["chaos"]
    assert reload["event"] == "reload" and len(reload["versions"]) == 2, reload
    assert kill["event"] == "executor SIGKILLed"
    table = (tmp_path / "results" / "serve.md").read_text()
    assert "| yes      |       4 |" in table and "executor SIGKILLed" in table
