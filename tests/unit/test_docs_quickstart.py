"""The Python code blocks of docs/quickstart.md's "Training a model" section run as
written, one after another in one namespace (the way a reader pastes them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
_TEXT = DOC.read_text()
SECTION = _TEXT[_TEXT.index("## Training a model"):]
SECTION = SECTION[:SECTION.index("\n## ", 3)]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, flags=re.S)


def test_the_training_section_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sklearn", reason="the section's data are scikit-learn's digits")
    assert len(BLOCKS) >= 4
    monkeypatch.chdir(tmp_path)  # the saving block writes checkpoint.npz
    ns: dict[str, object] = {"__name__": "__docs__"}
    for code in BLOCKS:
        exec(compile(code, str(DOC), "exec"), ns)
    out = capsys.readouterr().out
    assert "test accuracy" in out and "(64, 1, 8, 8) (64,)" in out
    assert (tmp_path / "checkpoint.npz").exists()
