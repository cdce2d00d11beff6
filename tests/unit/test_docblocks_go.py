"""The ``go`` language of tests/docblocks.py: a go block is a whole program built and run
against this checkout's sdk/go, its output shown; one that fails to build or exits non-zero
fails, naming the block."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from docblocks import blocks, run_file, runs_processes

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="the Go toolchain is not installed "
                                "(.ci/run installs golang-go)")


def test_a_go_block_runs_with_the_sdk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.md").write_text(
        "```go\npackage main\n\nimport (\n\t\"fmt\"\n\n\t\"triplane\"\n)\n\n"
        "func main() {\n\tx := triplane.Input(\"u\", []int{2, 3})\n"
        "\tfmt.Println(triplane.Matmul(x, x).Err() != nil, triplane.Relu(x).Type())\n}\n```\n")
    assert [b.lang for b in blocks("d.md", root=tmp_path)] == ["go"]
    assert run_file("d.md", {}, tmp_path / "home", tmp_path, root=tmp_path) == []
    assert "true float32[2, 3]" in capsys.readouterr().out


@pytest.mark.parametrize(("body", "says"), [
    ("package main\n\nfunc main() { undefined() }\n", "`go run` exited"),
    ("package main\n\nimport \"os\"\n\nfunc main() { os.Exit(3) }\n", "`go run` exited"),
    ("x := 1\n", "a whole program"),
])
def test_a_failing_go_block_fails_naming_it(tmp_path: Path, body: str, says: str) -> None:
    (tmp_path / "d.md").write_text(f"text\n\n```go\n{body}```\n")
    with pytest.raises(AssertionError, match=says) as e:
        run_file("d.md", {}, tmp_path / "home", tmp_path, root=tmp_path)
    assert "d.md block 1 (line 3, go)" in str(e.value)


def test_a_doc_with_go_blocks_runs_with_the_integration_module() -> None:
    assert runs_processes("docs/sdk-go.md")
