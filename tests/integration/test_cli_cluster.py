"""The ``triplane`` command against a live ``triplane up`` cluster, each command a real
subprocess (docs/cli.md): submit (YAML and JSON, --wait with values equal to numpy's,
--json, Ctrl-C cancelling or detaching), jobs, job, cancel, nodes, logs, and the one-line
errors for a wrong token, an unknown job and no cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from triplane.launcher import down as stop_cluster


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIPLANE_URL", "TRIPLANE_TOKEN")}
    env.update(TRIPLANE_HOME=str(home), COLUMNS="200", NO_COLOR="1", **extra)
    return env


def cli(home: Path, *args: str, timeout: float = 120.0, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triplane", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(home, **env))


def ok(home: Path, *args: str) -> str:
    r = cli(home, *args)
    assert r.returncode == 0, f"triplane {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def failed(r: subprocess.CompletedProcess[str]) -> str:
    """The one line a failing command printed (and it printed no traceback)."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster of two executors started with `triplane up`, stopped at the end."""
    h = tmp_path_factory.mktemp("cli") / "home"
    try:
        ok(h, "up", "--executors", "2", "--memory", "256MiB")
        yield h
    finally:
        stop_cluster(h, grace_s=2.0)


def small_graph() -> dict[str, object]:
    """c = ones(2, 3) * 2 and s = sum(c), in the IR's graph document form."""
    f32 = "float32"
    return {"version": 1, "outputs": ["c", "s"], "nodes": {
        "a": {"op": "full", "shape": [2, 3], "dtype": f32, "attrs": {"shape": [2, 3], "dtype": f32,
                                                                     "value": 1}},
        "b": {"op": "full", "shape": [], "dtype": f32, "attrs": {"shape": [], "dtype": f32, "value": 2.0}},
        "c": {"op": "mul", "shape": [2, 3], "dtype": f32, "inputs": ["a", "b"]},
        "s": {"op": "sum", "shape": [], "dtype": f32, "inputs": ["c"],
              "attrs": {"axes": None, "keepdims": False}},
    }}


def slow_graph(steps: int = 400, n: int = 1024) -> dict[str, object]:
    """A chain of ``steps`` n x n matmuls: tens of seconds on a small machine."""
    f32 = "float32"
    nodes: dict[str, object] = {"x": {"op": "full", "shape": [n, n], "dtype": f32,
                                      "attrs": {"shape": [n, n], "dtype": f32, "value": 0.001}}}
    prev = "x"
    for i in range(steps):
        nodes[f"m{i}"] = {"op": "matmul", "shape": [n, n], "dtype": f32, "inputs": [prev, "x"]}
        prev = f"m{i}"
    return {"version": 1, "nodes": nodes, "outputs": [prev]}


def test_submit_yaml_waits_and_prints_the_values(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(small_graph()))
    out = ok(home, "submit", str(path), "--wait", "--json")
    body = json.loads(out)
    assert body["state"] == "done"
    np.testing.assert_array_equal(np.array(body["values"]["c"]["data"], np.float32),
                                  np.full((2, 3), 2, np.float32))
    assert body["values"]["c"]["shape"] == [2, 3] and body["values"]["c"]["dtype"] == "float32"
    assert body["values"]["s"]["data"] == 12.0
    released = json.loads(ok(home, "job", body["id"], "--json"))  # its tiles released, still listed
    assert released["state"] == "done"
    info = json.loads((home / "cluster.json").read_text())
    gone = httpx.get(f"{info['url']}/v1/jobs/{body['id']}/tensors/s",
                     headers={"Authorization": f"Bearer {(home / 'token').read_text().strip()}"})
    assert gone.status_code == 404, gone.text  # released once fetched (no --keep)
    text = ok(home, "submit", str(path), "--wait", "--fetch", "s", "--save", str(tmp_path / "out"))
    assert "s float32[]:" in text and "12." in text
    assert float(np.load(tmp_path / "out" / "s.npy", allow_pickle=False)) == 12.0


def test_submit_json_job_request_then_job_and_jobs_show_it(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"graph": small_graph(), "fetch": ["s"]}))
    job = json.loads(ok(home, "submit", str(path), "--json"))["id"]
    deadline = time.monotonic() + 60
    while (state := json.loads(ok(home, "job", job, "--json"))["state"]) not in ("done", "failed"):
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert state == "done"
    listed = json.loads(ok(home, "jobs", "--json", "--limit", "50"))
    assert job in [j["id"] for j in listed["items"]]
    assert set(listed) == {"items", "next"}
    assert job in ok(home, "jobs")  # the table


def test_submit_refuses_a_bad_file_in_one_line(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: !!python/object:os.system {}\n")  # the safe loader refuses tags
    r = cli(home, "submit", str(bad))
    assert r.returncode == 2 and "is not valid YAML" in r.stderr and "Traceback" not in r.stderr, r.stderr
    wrong = tmp_path / "wrong.json"
    node = {"op": "nope", "shape": [], "dtype": "float32"}
    wrong.write_text(json.dumps({"version": 1, "nodes": {"a": node}, "outputs": ["a"]}))
    line = failed(cli(home, "submit", str(wrong)))
    assert "400" in line and "nope" in line, line


def _interrupted_submit(home: Path, tmp_path: Path,
                        *extra: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow_graph()))
    p = subprocess.Popen([sys.executable, "-m", "triplane", "submit", str(path), "--wait", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(home))
    assert p.stderr is not None
    first = p.stderr.readline()  # "job J submitted; waiting for it (Ctrl-C ...)"
    assert "submitted; waiting" in first, first
    job = first.split()[1]
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return job, subprocess.CompletedProcess(p.args, p.returncode, out, first + err)


def test_ctrl_c_while_waiting_cancels_the_job(home: Path, tmp_path: Path) -> None:
    job, r = _interrupted_submit(home, tmp_path)
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert f"interrupted: job {job} cancelled" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert json.loads(ok(home, "job", job, "--json"))["state"] == "cancelled"


def test_ctrl_c_with_detach_leaves_the_job_running(home: Path, tmp_path: Path) -> None:
    job, r = _interrupted_submit(home, tmp_path, "--on-interrupt", "detach")
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert f"detached: job {job} goes on" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert json.loads(ok(home, "job", job, "--json"))["state"] in ("queued", "running")
    said = ok(home, "cancel", job)
    assert f"job {job}: cancelled" in said, said
    assert json.loads(ok(home, "job", job, "--json"))["state"] == "cancelled"


def test_nodes_lists_the_executors(home: Path) -> None:
    nodes = json.loads(ok(home, "nodes", "--json"))["items"]
    assert sorted(n.get("node") or n.get("id") for n in nodes) == ["executor-0", "executor-1"]
    table = ok(home, "nodes")
    assert "executor-0" in table and "numpy" in table, table


def test_logs_lists_and_prints_a_process_log(home: Path) -> None:
    listed = json.loads(ok(home, "logs", "--json"))["items"]
    assert {"scheduler", "executor-0", "executor-1"} <= {x["process"] for x in listed}
    tail = ok(home, "logs", "scheduler", "--tail", "5")
    assert 0 < len(tail.splitlines()) <= 5
    whole = (home / "logs" / "scheduler.log").read_text().splitlines()
    assert tail.splitlines() == whole[-len(tail.splitlines()):]
    line = failed(cli(home, "logs", "nope"))
    assert "no log of 'nope'" in line and "scheduler" in line, line


def test_errors_are_one_line_naming_what_was_wrong(home: Path, tmp_path: Path) -> None:
    line = failed(cli(home, "jobs", "--token", "not-a-token"))
    assert "refused the token (401" in line, line
    line = failed(cli(home, "job", "j0000000000000000"))
    assert "unknown job" in line and "j0000000000000000" in line, line
    line = failed(cli(tmp_path / "empty", "jobs"))
    assert f"no cluster is running from {tmp_path / 'empty'}" in line and "triplane up" in line, line
    line = failed(cli(tmp_path / "empty", "nodes", "--url", "http://127.0.0.1:9"))
    assert "no scheduler answers at http://127.0.0.1:9" in line, line


def _submit(home: Path, tmp_path: Path, graph: dict[str, object], *args: str) -> str:
    path = tmp_path / f"g{time.monotonic_ns()}.json"
    path.write_text(json.dumps(graph))
    return str(json.loads(ok(home, "submit", str(path), "--json", *args))["id"])


def test_jobs_pages_and_filters_by_name_tags_and_state(home: Path, tmp_path: Path) -> None:
    label = f"pages-{time.monotonic_ns()}"
    ids = [_submit(home, tmp_path, small_graph(), "--name", label, "--tag", "cli", "--tag", f"n{i}")
           for i in range(3)]
    seen: list[str] = []
    cursor: list[str] = []
    while True:  # one job a page, following "next"
        page = json.loads(ok(home, "jobs", "--name", label, "--limit", "1", "--json", *cursor))
        seen += [j["id"] for j in page["items"]]
        if not page["next"]:
            break
        cursor = ["--cursor", page["next"]]
    assert seen == ids[::-1]  # newest first, each once
    every = json.loads(ok(home, "jobs", "--name", label, "--limit", "2", "--all", "--json"))
    assert [j["id"] for j in every["items"]] == ids[::-1] and every["next"] is None
    one = json.loads(ok(home, "jobs", "--tag", "cli", "--tag", "n1", "--json"))["items"]
    assert [j["id"] for j in one] == [ids[1]] and one[0]["tags"] == ["cli", "n1"]
    assert json.loads(ok(home, "jobs", "--name", label, "--state", "failed", "--json"))["items"] == []
    assert json.loads(ok(home, "jobs", "--name", label, "--since", "10m", "--json"))["items"]
    assert json.loads(ok(home, "jobs", "--name", label, "--until", "1h", "--json"))["items"] == []
    detail = json.loads(ok(home, "job", ids[0], "--json"))
    assert detail["name"] == label and detail["tags"] == ["cli", "n0"] and detail["owner"] == "admin"
    line = failed(cli(home, "jobs", "--cursor", "not-a-cursor"))
    assert "cursor" in line and "400" in line, line


def test_tasks_and_retry_of_a_cancelled_job(home: Path, tmp_path: Path) -> None:
    # 200 matmuls of 1024 x 1024: several seconds, so the cancel (a process start away) finds it running
    job = _submit(home, tmp_path, slow_graph(steps=200), "--name", "again")
    ok(home, "cancel", job)
    tasks = json.loads(ok(home, "tasks", job, "--all", "--json"))["items"]
    assert tasks and all({"id", "op", "state", "attempt", "node", "drifts"} <= set(t) for t in tasks)
    assert "tasks of " + job in ok(home, "tasks", job)
    new = json.loads(ok(home, "retry", job, "--wait", "--json"))
    assert new["retry_of"] == job and new["id"] != job and new["state"] == "done"
    assert json.loads(ok(home, "job", new["id"], "--json"))["name"] == "again"
    line = failed(cli(home, "retry", new["id"]))  # a done job is not retried
    assert "409" in line, line
    line = failed(cli(home, "tasks", "j0000000000000000"))
    assert "unknown job" in line and "404" in line, line


def test_drain_and_undrain_a_node(home: Path, tmp_path: Path) -> None:
    job = _submit(home, tmp_path, slow_graph(steps=60))  # tasks running on both executors
    try:
        said = ok(home, "drain", "executor-1", "--wait", "--timeout", "60")
        assert "executor-1: drained" in said and "executor-1: no task runs there" in said, said
        nodes = {n["node"]: n for n in json.loads(ok(home, "nodes", "--json"))["items"]}
        assert {k: n.get("drained") for k, n in nodes.items()} == {"executor-0": False, "executor-1": True}
        assert nodes["executor-1"]["running"] == 0
    finally:
        ok(home, "undrain", "executor-1")
        ok(home, "cancel", job)
    assert not any(n.get("drained") for n in json.loads(ok(home, "nodes", "--json"))["items"])
    line = failed(cli(home, "drain", "no-such-node"))
    assert "no-such-node" in line and "404" in line, line


def test_tokens_over_rest_work_at_once_and_stop_when_removed(home: Path) -> None:
    name = f"reader{time.monotonic_ns()}"
    secret = ok(home, "tokens", "add", name, "--role", "read").strip()
    assert {"name": name, "role": "read"}.items() <= next(
        e for e in json.loads(ok(home, "tokens", "list", "--json"))["items"] if e["name"] == name).items()
    assert set(json.loads(ok(home, "jobs", "--token", secret, "--json"))) == {"items", "next"}
    line = failed(cli(home, "drain", "executor-0", "--token", secret))  # read may not drain
    assert "403" in line, line
    ok(home, "tokens", "remove", name)
    assert name not in ok(home, "tokens", "list")
    line = failed(cli(home, "jobs", "--token", secret))
    assert "refused the token (401" in line, line


def test_tiles_of_a_kept_job(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(small_graph()))
    job = json.loads(ok(home, "submit", str(path), "--wait", "--keep", "--json"))["id"]
    tiles = json.loads(ok(home, "tiles", job, "--json"))["items"]
    assert sorted(t["nbytes"] for t in tiles) == [4, 24]  # s: one float32, c: six
    assert all(t["node"] in ("executor-0", "executor-1") for t in tiles)
    assert "tiles of " + job in ok(home, "tiles", job)


# --- events (GET /v1/events and its SSE stream: the s4-events branch) ----------------------

def _events_served(home: Path) -> None:
    r = cli(home, "events", "--limit", "1")
    if r.returncode != 0 and "does not serve GET /v1/events" in r.stderr:
        pytest.skip("pending: this scheduler does not serve GET /v1/events yet (s4-events' route)")


def test_events_follow_a_job_in_order_to_its_end(home: Path, tmp_path: Path) -> None:
    _events_served(home)
    job = _submit(home, tmp_path, slow_graph(steps=40))
    followed = [json.loads(ln) for ln in ok(home, "events", "--job", job, "--follow", "--json").splitlines()]
    ids = [e["id"] for e in followed]
    assert ids == sorted(set(ids)), ids  # in order, each once
    kinds = [e["kind"] for e in followed]
    assert kinds[0] == "job.submitted" and kinds[-1] == "job.done" and "job.running" in kinds, kinds
    assert {e["job"] for e in followed} == {job}
    page = json.loads(ok(home, "events", "--job", job, "--json", "--limit", "1000"))
    assert [e["id"] for e in page["items"]] == ids  # the page and the stream agree
    done = json.loads(ok(home, "events", "--kind", "job.done", "--after", str(ids[0]), "--json"))["items"]
    assert job in [e["job"] for e in done] and {e["kind"] for e in done} == {"job.done"}
    text = ok(home, "logs", "--job", job)
    assert "job.submitted" in text and "job.done" in text, text
    again = ok(home, "logs", "--job", job, "--follow")  # an ended job: its events, then the end
    assert again.count("job.done") == 1, again


# --- a graph without shapes and a gradient request (the s4-shapes branch) -----------------

GRAD_YAML = """\
graph:
  version: 1
  outputs: [loss]
  nodes:
    w: {op: full, attrs: {shape: [2, 3], dtype: float32, value: 0.5}}
    x: {op: full, attrs: {shape: [3, 4], dtype: float32, value: 2.0}}
    y: {op: matmul, inputs: [w, X], loc: "model.py:3"}
    loss: {op: sum, inputs: [y], attrs: {axes: null, keepdims: false}}
grad: {of: loss, wrt: [w]}
"""


def test_submit_a_graph_without_shapes_with_a_gradient(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "grad.yaml"
    path.write_text(GRAD_YAML.replace("X", "x"))
    r = cli(home, "submit", str(path), "--wait", "--json")
    if r.returncode != 0 and "unknown field(s) ['grad']" in r.stderr:
        pytest.skip("pending: this scheduler takes no shapeless graph or grad request yet (s4-shapes)")
    assert r.returncode == 0, r.stderr
    values = json.loads(r.stdout)["values"]
    w, x = np.full((2, 3), 0.5, np.float32), np.full((3, 4), 2.0, np.float32)
    assert values["loss"]["data"] == pytest.approx(float((w @ x).sum()))
    np.testing.assert_allclose(values["grad:w"]["data"], np.ones((2, 4), np.float32) @ x.T)
    path.write_text(GRAD_YAML.replace("X", "w"))  # (2, 3) @ (2, 3)
    line = failed(cli(home, "submit", str(path)))
    assert "node 'y' (matmul)" in line and "model.py:3" in line and "400" in line, line


def test_logs_follow_prints_whole_lines_as_they_are_appended(tmp_path: Path) -> None:
    home = tmp_path / "run"  # a run directory with a log and no cluster: logs reads files
    (home / "logs").mkdir(parents=True)
    log = home / "logs" / "scheduler.log"
    log.write_text("one\n")
    p = subprocess.Popen([sys.executable, "-m", "triplane", "logs", "scheduler", "--follow"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(home))
    assert p.stdout is not None and p.stdout.readline() == "one\n"
    with log.open("a") as f:
        f.write("tw")
        f.flush()
        time.sleep(0.6)
        f.write("o\nthree\n")
    assert [p.stdout.readline(), p.stdout.readline()] == ["two\n", "three\n"]
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "stopped following" in err, err
