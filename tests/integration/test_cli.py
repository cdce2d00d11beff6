"""The ``triplane`` command, run as a real subprocess."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest

import triplane


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # a wide terminal so rich never truncates table cells
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "triplane.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_demo_exits_zero_and_its_loss_falls() -> None:
    r = _run("demo", "--steps", "30", "--seed", "3")
    assert r.returncode == 0, r.stderr
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+loss\s+([0-9.eE+-]+)$", r.stdout, re.M)]
    assert len(losses) == 30, r.stdout
    assert losses[-1] < 0.5 * losses[0], losses
    falls = sum(b < a for a, b in itertools.pairwise(losses))
    assert falls >= 0.7 * (len(losses) - 1), losses


def test_demo_says_what_data_it_fits_and_uses_compiled_steps() -> None:
    pytest.importorskip("sklearn", reason="the demo fits scikit-learn's digits when it is installed")
    r = _run("demo", "--embedded", "--steps", "40")
    assert r.returncode == 0, r.stderr
    assert "data: scikit-learn's digits: 1797 samples (1437 train, 360 test), 64 features (8x8 pixels), " \
           "10 classes" in r.stdout, r.stdout
    assert "MLP 64-32-10" in r.stdout and "compiled steps (tp.compile)" in r.stdout, r.stdout
    # Step 1 compiles, step 2 too (the momentum buffers appear), every later step replays.
    assert "compiled steps: 38 replayed, 2 compiled" in r.stdout, r.stdout
    accuracy = float(re.search(r"^test accuracy ([0-9.]+) \(360 held-out digits\)$", r.stdout, re.M)[1])
    assert accuracy >= 0.95, r.stdout


def test_demo_is_reproducible_per_seed() -> None:
    a, b = _run("demo", "--steps", "5", "--seed", "4"), _run("demo", "--steps", "5", "--seed", "4")
    lines = [[ln for ln in r.stdout.splitlines() if ln.startswith("step")] for r in (a, b)]
    assert lines[0] == lines[1] and len(lines[0]) == 5


def test_ops_lists_the_op_table() -> None:
    r = _run("ops")
    assert r.returncode == 0, r.stderr
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\W*(\w+)\s.*$", r.stdout, re.M)}
    for name in ("matmul", "conv2d", "add", "sum"):
        assert name in rows, r.stdout
    assert re.search(r"\bmatmul\b.*\blinalg\b.*\byes\b", rows["matmul"])


def test_version_and_bad_usage() -> None:
    r = _run("version")
    assert r.returncode == 0 and triplane.__version__ in r.stdout
    bad = _run("demo", "--steps", "0")
    assert bad.returncode != 0 and "steps" in (bad.stderr + bad.stdout)


def _commands() -> list[list[str]]:
    """Every command path of the app: ["jobs"], ["tokens", "add"], ..."""
    from typer.main import get_command

    from triplane.cli import app

    group = get_command(app)
    paths: list[list[str]] = []

    def walk(cmd: object, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*path, name])
        else:
            paths.append(path)

    walk(group, [])
    return paths


def test_every_command_answers_h_and_shows_flags_as_flags() -> None:
    from typer.testing import CliRunner

    from triplane.cli import app

    runner = CliRunner()
    paths = _commands()
    names = {" ".join(p) for p in paths}
    assert {"jobs", "job", "tasks", "cancel", "retry", "logs", "nodes", "drain", "undrain", "events",
            "submit", "tokens add", "tokens list", "tokens remove"} <= names, names
    for path in [[], *paths]:
        for flag in ("-h", "--help"):
            r = runner.invoke(app, [*path, flag], env={"COLUMNS": "200", "NO_COLOR": "1"})
            assert r.exit_code == 0, (path, flag, r.output)
            assert "Usage:" in r.output and "<bool>" not in r.output, (path, r.output)
            assert "--help" in r.output and "-h" in r.output, (path, r.output)


def test_json_on_every_command_that_prints_data() -> None:
    from typer.testing import CliRunner

    from triplane.cli import app

    runner = CliRunner()
    quiet = {"executor", "scheduler", "serve"}  # long-running servers: they print logs, not data
    for path in _commands():
        if " ".join(path) in quiet:
            continue
        r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert "--json" in r.output, (path, r.output)


def test_version_flag_at_the_top() -> None:
    for flag in ("--version", "-V"):
        r = _run(flag)
        assert r.returncode == 0 and r.stdout.strip() == f"triplane {triplane.__version__}", r
    r = _run("version", "--json")
    assert json.loads(r.stdout) == {"version": triplane.__version__}


def test_demo_json_is_the_only_stdout() -> None:
    r = _run("demo", "--embedded", "--steps", "3", "--json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)  # nothing else on stdout: the narrative went to stderr
    assert len(body["losses"]) == 3 and body["compiled_steps"]["compiled"] >= 1
    assert "step    1  loss" in r.stderr
