"""What the memory and network conformance kits report: one :class:`Check` per property
checked (pass, FAIL or skip, with what was seen), printed by :func:`check_table`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Check", "check_table"]


@dataclass(frozen=True)
class Check:
    """One check's outcome: its name, whether it passed, what it saw, how long it took;
    ``skipped`` when it does not apply to the engine (``detail`` says why)."""

    name: str
    ok: bool
    detail: str
    seconds: float
    skipped: bool = False

    @property
    def result(self) -> str:
        return "skip" if self.skipped else "pass" if self.ok else "FAIL"


def check_table(title: str, checks: Sequence[Check]) -> str:
    """The checks as a text table under ``title``, one row each, then a summary line."""
    width = max([18, *(len(c.name) for c in checks)])
    rows = [title, f"{'check':<{width}} {'result':<6} {'s':>6}  detail"]
    rows += [f"{c.name:<{width}} {c.result:<6} {c.seconds:>6.2f}  {c.detail}" for c in checks]
    failed = sum(not c.ok for c in checks)
    skipped = sum(c.skipped for c in checks)
    rows.append(f"{len(checks)} checks, {len(checks) - failed - skipped} passed, {failed} failed, "
                f"{skipped} skipped")
    return "\n".join(rows)
