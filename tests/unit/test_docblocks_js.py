"""tests/docblocks.py's js blocks: run by node as ES modules with ``triplane`` resolving to
sdk/js; a block that throws fails its file, naming the block; one that connects is
counted with the integration files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from docblocks import blocks, run_file, runs_processes

pytestmark = pytest.mark.skipif(shutil.which("node") is None,
                                reason="node is not installed (.ci/run installs it)")


def test_js_blocks_run_with_node_and_fail_when_they_throw(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ok.md").write_text(
        "```js\nimport * as tp from \"triplane\";\n"
        "const x = tp.input({ tensor: \"u\", shape: [2, 3], dtype: \"float32\" });\n"
        "console.log(\"shape\", tp.sum(x, { axes: 1 }).shape.join(\"x\"));\n```\n")
    (docs / "bad.md").write_text(
        "```javascript\nimport * as tp from \"triplane\";\n"
        "const x = tp.input({ tensor: \"u\", shape: [2, 3], dtype: \"float32\" });\n"
        "tp.matmul(x, x);\n```\n")
    work = tmp_path / "work"
    work.mkdir()
    assert run_file("docs/ok.md", {}, tmp_path / "home", work, root=tmp_path) == []
    assert "shape 2" in capsys.readouterr().out
    shown = r"(?s)docs/bad.md block 1 .*exited 1.*inner dimensions differ.*at .docjs-bad-1.mjs:4"
    with pytest.raises(AssertionError, match=shown):
        run_file("docs/bad.md", {}, tmp_path / "home", work, root=tmp_path)
    assert [b.lang for b in blocks("docs/bad.md", root=tmp_path)] == ["javascript"]


def test_a_js_block_that_connects_runs_with_the_integration_files() -> None:
    assert runs_processes("docs/sdk-js.md")
