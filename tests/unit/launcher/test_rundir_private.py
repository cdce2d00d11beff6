"""The run directory is its user's alone (0700 directories, 0600 files) whether or not it
existed before; processes ``up`` starts create private files; ``up`` prints the token only
with ``--show-token``; ``triplane tokens`` adds, lists and removes client tokens."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from triplane.cli import app
from triplane.launcher.procs import spawn
from triplane.launcher.rundir import RunDir
from triplane.scheduler.api.tokens import TokenBook, read_tokens


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def test_an_existing_world_readable_run_dir_is_made_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "tensors").mkdir()
    for f in ("logs/scheduler.log", "tensors/u-1.npy", "metadb.sqlite3", "cluster.json", "token"):
        (home / f).write_text("x")
        os.chmod(home / f, 0o644)
    for d in (home, home / "logs", home / "tensors"):
        os.chmod(d, 0o755)
    (home / "link").symlink_to("/etc/hostname")  # never followed
    before = os.stat("/etc/hostname").st_mode
    RunDir(home).create()
    modes = _modes(home)
    modes.pop("link")
    assert {k: oct(v) for k, v in modes.items() if v not in (0o700, 0o600)} == {}
    for d in (".", "logs", "tensors"):
        assert modes[d] == 0o700
    assert os.stat("/etc/hostname").st_mode == before


def test_a_new_run_dir_and_its_secrets_are_private(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "new")
    run.create()
    run.new_secrets()
    run.write_cluster({"url": "http://x"})
    with run.locked():
        pass
    assert all(v in (0o700, 0o600) for v in _modes(run.path).values()), _modes(run.path)


def test_spawned_processes_write_private_files_and_logs(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        log = tmp_path / "logs" / "p.log"
        made = tmp_path / "made.bin"
        p = spawn([sys.executable, "-c", f"open({str(made)!r}, 'w').write('x')"], log)
        assert p.wait(30) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_up_prints_the_token_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import triplane.launcher as launcher

    secret_token = "tok-" + "z" * 40

    def fake_up(cfg: Any, home: Any) -> dict[str, Any]:
        return {"url": "http://127.0.0.1:1", "executors": [], "registry": "memory://",
                "home": str(tmp_path), "token": secret_token, "token_file": str(tmp_path / "token")}

    monkeypatch.setattr(launcher, "up", fake_up)
    runner = CliRunner()
    quiet = runner.invoke(app, ["up", "--executors", "0", "--home", str(tmp_path)])
    assert quiet.exit_code == 0, quiet.output
    assert secret_token not in quiet.output and "--show-token" in quiet.output
    shown = runner.invoke(app, ["up", "--executors", "0", "--home", str(tmp_path), "--show-token"])
    assert shown.exit_code == 0 and secret_token in shown.output


def test_tokens_cli_adds_lists_and_removes(tmp_path: Path) -> None:
    runner = CliRunner()
    home = ["--home", str(tmp_path / "home")]
    tokens: dict[str, str] = {}
    for name, role in (("alice", "submit"), ("viewer", "read"), ("ops", "admin")):
        r = runner.invoke(app, ["tokens", "add", name, "--role", role, *home])
        assert r.exit_code == 0, r.output
        tokens[name] = r.output.strip()
    path = tmp_path / "home" / "tokens.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert all(t not in path.read_text() for t in tokens.values())
    book = TokenBook(path)
    assert {n: book.lookup(t).role for n, t in tokens.items()} == \
        {"alice": "submit", "viewer": "read", "ops": "admin"}  # type: ignore[union-attr]
    listed = runner.invoke(app, ["tokens", "list", *home])
    assert listed.output.split() == ["alice", "submit", "viewer", "read", "ops", "admin"]
    assert runner.invoke(app, ["tokens", "add", "alice", "--role", "read", *home]).exit_code == 2
    assert runner.invoke(app, ["tokens", "add", "eve", "--role", "root", *home]).exit_code == 2
    assert runner.invoke(app, ["tokens", "remove", "alice", *home]).exit_code == 0
    assert runner.invoke(app, ["tokens", "remove", "alice", *home]).exit_code == 1
    assert [e.name for e in read_tokens(path)] == ["viewer", "ops"]
    assert book.lookup(tokens["alice"]) is None
    assert json.loads(path.read_text())["version"] == 1
