"""``bench/train.py --memory-run STEPS``: is a long training run on a cluster flat?

Trains one model (``--large`` by default: MLP 1024-2048-2048-10, batch 512) with Adam on a
local cluster (``--executors`` executors of ``--memory`` each) for STEPS optimiser steps, the
parameters and optimiser state kept on the cluster, and at two marks (step ``--mark``,
default 100, and the last step) records:

* executor memory in use: the sum over nodes of capacity minus free bytes from
  ``GET /v1/nodes`` (read after the executors' next report, about a second later);
* the scheduler's resident set size (``VmRSS`` of its process);
* the run directory's size on disk (uploads, checkpoint copies, metadb, logs), and of
  its uploads (``tensors/``) and its metadb apart.

It prints both rows and the ratio last/mark of each; the issue's target is that they
differ by less than 10%. tests/integration/bench/test_train_memory.py asserts the same over
a shorter run.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from train_systems import Model, Triplane, TriplaneCluster, init_weights, make_data

TARGET = 0.10  # at most this relative difference between the marks


def executor_bytes(cluster: TriplaneCluster) -> int:
    """Bytes in use in every executor's memory engine, from ``GET /v1/nodes``."""
    nodes = cluster.session.nodes()
    return sum(int(n["memory"]["capacity"]) - int(n["memory"]["free"]) for n in nodes)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # deleted meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def measure(cluster: TriplaneCluster) -> dict[str, int]:
    """The three figures, once the session's queued releases are sent and the executors
    have reported since (they publish their free bytes about every second)."""
    cluster.session.keeper.flush()
    time.sleep(2.5)
    home = cluster.home
    return {"executor_bytes": executor_bytes(cluster),
            "scheduler_rss": rss_bytes(cluster.cluster.scheduler.pid),
            "run_dir_bytes": dir_bytes(home),
            "uploads_bytes": dir_bytes(home / "tensors"),  # uploads and checkpoint copies
            "metadb_bytes": sum(p.stat().st_size for p in home.glob("metadb.sqlite3*"))}


def memory_run(m: Model, steps: int, mark: int, executors: int = 2, memory: str = "1GiB",
               say: Callable[[str], None] = print, checkpoint_every: int | None = None) -> dict[str, Any]:
    """Train ``m`` for ``steps`` steps on a fresh local cluster; the figures at ``mark``
    and at ``steps``, their ratios and the losses (first, at the mark, last)."""
    if not 0 < mark < steps:
        raise ValueError(f"the mark ({mark}) must lie between 0 and the steps ({steps})")
    cluster = TriplaneCluster(executors, memory)
    try:
        if checkpoint_every is not None:
            cluster.session.resident.every = checkpoint_every
        system = Triplane(m, init_weights(m), cluster)
        data = make_data(m)
        rows: dict[int, dict[str, int]] = {}
        losses: dict[int, float] = {}
        t0 = time.perf_counter()
        for i in range(1, steps + 1):
            system.step(*data[i % len(data)])
            if i in (1, mark, steps):
                losses[i] = system.loss()
            if i in (mark, steps):
                rows[i] = measure(cluster)
                say(f"step {i}: {_row(rows[i])} (loss {losses[i]:.4f}, "
                    f"{(time.perf_counter() - t0) / i * 1000:.0f} ms/step so far)")
            elif i % 50 == 0:
                say(f"step {i} ...")
        ratios = {k: rows[steps][k] / max(1, rows[mark][k]) for k in rows[mark]}
        return {"model": m.label, "steps": steps, "mark": mark, "executors": executors, "memory": memory,
                "at_mark": rows[mark], "at_end": rows[steps], "ratios": ratios, "losses": losses,
                "flat": all(abs(ratios[k] - 1) < TARGET for k in ("executor_bytes", "scheduler_rss",
                                                                  "run_dir_bytes")),
                "seconds": time.perf_counter() - t0}
    finally:
        cluster.close()


def _row(r: dict[str, int]) -> str:
    mib = 1024 * 1024
    return (f"executors {r['executor_bytes'] / mib:.1f} MiB in use, scheduler RSS "
            f"{r['scheduler_rss'] / mib:.1f} MiB, run directory {r['run_dir_bytes'] / mib:.1f} MiB")


def report(res: dict[str, Any]) -> str:
    mark, end = res["mark"], res["steps"]
    lines = [f"Memory run: {res['model']}, {end} steps, {res['executors']} executors of {res['memory']}", "",
             f"| figure | after step {mark} | after step {end} | ratio |", "|---|---:|---:|---:|"]
    names = {"executor_bytes": "executor memory in use (MiB)", "scheduler_rss": "scheduler RSS (MiB)",
             "run_dir_bytes": "run directory (MiB)", "uploads_bytes": "... of which uploads and checkpoints",
             "metadb_bytes": "... of which the metadb (SQLite and its WAL)"}
    for k, label in names.items():
        lines.append(f"| {label} | {res['at_mark'][k] / 2**20:.1f} | {res['at_end'][k] / 2**20:.1f} "
                     f"| {res['ratios'][k]:.3f} |")
    losses = res["losses"]
    verdict = "met" if res["flat"] else "NOT met"
    lines += ["", f"loss: step 1 {losses[1]:.4f}, step {mark} {losses[mark]:.4f}, step {end} "
              f"{losses[end]:.4f}; {res['seconds']:.0f} s in all",
              f"target (issue 12): every ratio within {TARGET:.0%} of 1: {verdict}"]
    return "\n".join(lines)
