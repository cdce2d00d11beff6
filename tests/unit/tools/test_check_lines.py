"""tools/check_lines.py: the 600-line budget that .ci/run enforces."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "check_lines.py"


def _load():  # tools/ is not a package: load the script as a module
    spec = importlib.util.spec_from_file_location("check_lines", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_lines = _load()


def _write(root: Path, rel: str, lines: int) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n" * lines)


def test_files_over_the_budget_are_reported_and_the_rest_pass(tmp_path: Path) -> None:
    _write(tmp_path, "triplane/ok.py", 600)
    _write(tmp_path, "triplane/sub/long.py", 601)
    _write(tmp_path, "tests/unit/test_long.py", 900)
    _write(tmp_path, "bench/fine.py", 10)
    _write(tmp_path, "examples/long.py", 700)
    _write(tmp_path, "docs/not_checked.py", 5000)  # outside the checked folders
    (tmp_path / "triplane" / "notes.txt").write_text("x\n" * 5000)  # not Python
    assert check_lines.over_budget(tmp_path, exceptions={}) == [
        ("triplane/sub/long.py", 601), ("tests/unit/test_long.py", 900), ("examples/long.py", 700),
    ]


def test_an_exception_is_skipped_only_by_its_exact_path(tmp_path: Path) -> None:
    _write(tmp_path, "triplane/big.py", 700)
    _write(tmp_path, "triplane/other/big.py", 700)
    found = check_lines.over_budget(tmp_path, exceptions={"triplane/big.py": "a branch splits it"})
    assert found == [("triplane/other/big.py", 700)]


def test_no_file_is_excepted() -> None:
    assert check_lines.EXCEPTIONS == {}


def test_the_script_exits_1_and_names_the_file(tmp_path: Path) -> None:
    _write(tmp_path, "tests/huge.py", 601)
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 1
    assert "tests/huge.py: 601 lines" in run.stdout
    (tmp_path / "tests" / "huge.py").write_text("x = 1\n")
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == ""


def test_this_repository_is_within_the_budget() -> None:
    assert check_lines.over_budget(ROOT) == []
