"""schemathesis against a live scheduler's ``/openapi.json`` (issue 13's must-show, run by
.ci/run as its own step): every operation of the schema is called with generated
requests (the schema's examples, its coverage cases -- boundary and invalid values -- and
random ones), bounded in examples and time, with the admin token; no answer may be a 5xx
and none may violate the schema (each route's response model, and the error shape).

The cluster is a real one (``triplane up``'s launcher, one executor) with a done job, a
running one, a drained node, an upload and a session in it, so the lists are not empty,
and the routes of one job, node, upload or session are called with real ones
(``schemathesis.toml``'s ``[parameters]``) as well as generated ones."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from cluster_run import running_cluster

MAX_EXAMPLES = 10   # per operation and phase
MAX_TIME_S = 120    # the whole schemathesis run
CHECKS = "not_a_server_error,response_schema_conformance"


def _seed(url: str, headers: dict[str, str]) -> dict[str, str]:
    """A done job, a running one, a drained node, an upload and a session; the path
    parameters that name them (schemathesis calls the routes of each with these)."""
    with httpx.Client(base_url=url, headers=headers, timeout=30.0) as h:
        u = h.post("/v1/tensors", content=bytes(16), headers={"X-Triplane-Shape": "2,2",
                                                              "X-Triplane-Dtype": "float32"}).json()["id"]
        x = {"op": "input", "shape": [2, 2], "dtype": "float32",
             "attrs": {"tensor": u, "shape": [2, 2], "dtype": "float32"}}
        doc = {"version": 1, "nodes": {"x": x, "y": {"op": "exp", "inputs": ["x"], "shape": [2, 2],
                                                     "dtype": "float32"}}, "outputs": ["y"]}
        r = h.post("/v1/jobs", json={"graph": doc, "fetch": ["y"], "wait_s": 30, "name": "seed",
                                     "tags": ["schema"]})
        assert r.status_code == 201 and r.json()["state"] == "done", r.text
        node = h.get("/v1/nodes").json()["items"][0]["node"]
        assert h.post(f"/v1/nodes/{node}/drain").json()["drained"] is True
        done = r.json()["id"]
        r = h.post("/v1/jobs", json={"graph": doc, "fetch": ["y"]})  # waits: its only node is drained
        assert r.status_code == 201 and r.json()["state"] == "running", r.text
        session = h.post("/v1/sessions").json()["id"]
        return {"job": done, "name": "y", "node": node, "upload": u, "sid": session}


def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "home", bound_s=MAX_TIME_S + 120.0, executors=1) as c:
        headers = {"Authorization": f"Bearer {c.token}"}
        known = _seed(c.url, headers)
        (tmp_path / "schemathesis.toml").write_text(  # read from the working directory
            "[parameters]\n" + "".join(f'"path.{k}" = "{v}"\n' for k, v in known.items()))
        started = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()", "run",
             f"{c.url}/openapi.json", "--header", f"Authorization: Bearer {c.token}", "--checks", CHECKS,
             "--max-examples", str(MAX_EXAMPLES), "--max-time", str(MAX_TIME_S), "--seed", "13",
             "--phases", "examples,coverage,fuzzing", "--workers", "1", "--request-timeout", "20",
             "--generation-deterministic"],
            cwd=tmp_path, capture_output=True, text=True, timeout=MAX_TIME_S + 90)
        took = time.monotonic() - started
        out = r.stdout + r.stderr
        assert r.returncode == 0, f"schemathesis found failures (exit {r.returncode}):\n{out[-12000:]}"
        assert "Tested: " in out, out[-3000:]
        assert "schemathesis.toml" in out, out[:3000]  # it read the seeded parameters
        selected = out.split("Selected: ", 1)[1].split()[0]  # "31/31": every operation of the schema
        total = selected.split("/")[1]
        assert selected == f"{total}/{total}" and int(total) >= 30, out[-3000:]
        assert took < MAX_TIME_S + 60, took
        # the cluster still serves: nothing the fuzzing sent broke it
        assert httpx.get(f"{c.url}/ready", timeout=10).status_code == 200
