"""Helpers shared by the benchmarks: measured rows, summaries, machine facts, result files.

A benchmark measures each system a few times and keeps every run; ``Row`` summarises them
(best and median). ``write_results`` writes ``<name>.json`` (every number, for scripts) and
``<name>.md`` (the table, for people) into ``bench/results/`` together with the facts of
the machine, so a table never travels without the conditions it was measured under.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class Row:
    """One system's runs. ``rates`` are tasks per second (one per run); ``roundtrips_us``
    are per-task round trips in microseconds (one per run, may be empty). ``status`` is
    ``ok``, or why there are no numbers (``not installed``, ``skipped``, ``failed: ...``).
    ``details`` holds what else a run measured (e.g. the submit share of a job's time)."""

    name: str
    rates: list[float] = field(default_factory=list)
    roundtrips_us: list[float] = field(default_factory=list)
    status: str = "ok"
    notes: str = ""
    details: list[dict[str, Any]] = field(default_factory=list)  # per run, system-specific

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.rates)

    @property
    def best_rate(self) -> float | None:
        return max(self.rates) if self.rates else None

    @property
    def median_rate(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None

    @property
    def best_roundtrip_us(self) -> float | None:
        return min(self.roundtrips_us) if self.roundtrips_us else None

    @property
    def median_roundtrip_us(self) -> float | None:
        return statistics.median(self.roundtrips_us) if self.roundtrips_us else None

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "best_rate": self.best_rate, "median_rate": self.median_rate,
                "best_roundtrip_us": self.best_roundtrip_us,
                "median_roundtrip_us": self.median_roundtrip_us}


def timed(fn: Callable[[], Any]) -> float:
    """Seconds that ``fn()`` took (wall clock, perf_counter)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_facts(packages: Sequence[str] = ()) -> dict[str, Any]:
    """What the numbers depend on: CPUs, OS, Python, the versions of ``packages``."""
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "cpu": _cpu_model(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {p: version_of(p) for p in packages},
    }
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        facts["commit"] = rev.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        facts["commit"] = None
    return facts


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def fmt(x: float | None, digits: int = 0, suffix: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}{suffix}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """A GitHub markdown table; ``right[i]`` right-aligns column i."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w)
                                 for c, w, r in zip(cells, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2))
                          for w, r in zip(widths, right)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def write_results(name: str, payload: dict[str, Any], markdown: str,
                  directory: Path = RESULTS_DIR) -> tuple[Path, Path]:
    """Write ``<directory>/<name>.json`` and ``<name>.md``; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    jpath, mpath = directory / f"{name}.json", directory / f"{name}.md"
    jpath.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    mpath.write_text(markdown.rstrip() + "\n")
    return jpath, mpath


# --- BLAS threads in child processes (bench/compute.py) --------------------------------------

# Set on some processors of the development machines so that old OpenBLAS builds pick a
# safe kernel; a current numpy then runs a slower one. Benchmarks unset both together in
# their child processes (never in tests or CI) and record which kernel ran.
OPENBLAS_PIN_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_env(threads: int, *, unpin: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process: ``threads`` BLAS threads, and with ``unpin`` the
    OpenBLAS core-type pins removed (both together)."""
    env = dict(os.environ if base is None else base)
    env.update({k: str(threads) for k in BLAS_THREAD_VARS})
    if unpin:
        for k in OPENBLAS_PIN_VARS:
            env.pop(k, None)
    return env


def blas_info() -> list[dict[str, Any]]:
    """This process's BLAS libraries (threadpoolctl): kernel architecture and threads; []
    when threadpoolctl is not installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("internal_api", "architecture", "num_threads", "version")
    return [{k: i.get(k) for k in keep} for i in threadpool_info() if i.get("user_api") == "blas"]
