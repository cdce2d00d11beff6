"""The Python code blocks of docs/concepts.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_code_to_run() -> None:
    assert BLOCKS


@pytest.mark.parametrize("code", BLOCKS)
def test_python_blocks_run(code: str) -> None:
    exec(compile(code, str(DOC), "exec"), {"__name__": "__docs__"})
