"""Fail on any Python file of the project over the line budget (docs/layout.md, STYLE.md 13).

    python3 tools/check_lines.py [ROOT]

Checks every ``.py`` file under ``triplane/``, ``tests/``, ``bench/`` and ``examples/`` of
ROOT (default: the repository this script is in). Prints each file over the budget with
its line count and exits 1; exits 0 when all fit. A file too long is split by concept,
not trimmed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

MAX_LINES = 600
FOLDERS = ("triplane", "tests", "bench", "examples")

# Files allowed over the budget, each with the reason (the only place exceptions are
# listed). None today: a file too long is split by concept.
EXCEPTIONS: dict[str, str] = {}


def python_files(root: Path) -> Iterator[Path]:
    for folder in FOLDERS:
        yield from sorted((root / folder).rglob("*.py"))


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def over_budget(root: Path, max_lines: int = MAX_LINES,
                exceptions: dict[str, str] | None = None) -> list[tuple[str, int]]:
    """(path relative to ``root``, line count) of each file over ``max_lines`` that is not
    an exception, in path order."""
    allowed = EXCEPTIONS if exceptions is None else exceptions
    found = []
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        n = count_lines(path)
        if n > max_lines and rel not in allowed:
            found.append((rel, n))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    bad = over_budget(root)
    for rel, n in bad:
        print(f"{rel}: {n} lines (the budget is {MAX_LINES}: split it by concept)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
