"""CPU time per task of each cluster process, for bench/dispatch.py's two jobs (issue 11).

    PYTHONPATH=/path/to/tree python bench/dispatch_cpu.py [--tasks 10000] [--chain 500] [--repeats 3]

Wall time on a shared 2-core machine moves by tens of percent from run to run; the CPU a
process spends does far less. This starts a cluster the way ``bench/dispatch.py`` does
(``triplane up --executors 2``, from the ``bench/dispatch.py`` of the tree on
``PYTHONPATH``, so a base tree is measured with its own launcher), runs its throughput job
(``--tasks`` independent no-op tasks) and its chain (``--chain`` dependent tasks)
``--repeats`` times each, and reads ``/proc/<pid>/task/*/schedstat`` of the scheduler and
both executors before the POST, after its 201 and once the job is done. Printed per job,
best run (by the scheduler's figure) and every run, in µs of CPU per task: the
scheduler's in all, the part spent until the 201 (``submit``: parse, validate, store,
compile), its main thread's (the event loop), and both executors' together. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def cpu_us(pid: int, thread: int | None = None) -> float:
    """CPU time of ``pid`` (all its threads, or only ``thread``) in µs, from schedstat."""
    paths = [Path(f"/proc/{pid}/task/{thread}")] if thread else list(Path(f"/proc/{pid}/task").glob("*"))
    total = 0
    for p in paths:
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
            total += int((p / "schedstat").read_text().split()[0])
    return total / 1e3


def measure(client: Any, sched: int, executors: list[int], graph: dict[str, Any], n: int) -> dict[str, float]:
    body = json.dumps({"graph": graph, "fetch": []}, separators=(",", ":")).encode()
    s0, m0, e0 = cpu_us(sched), cpu_us(sched, sched), sum(cpu_us(p) for p in executors)
    t0 = time.perf_counter()
    r = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    s1 = cpu_us(sched)
    if r.status_code != 201:
        raise RuntimeError(f"POST /v1/jobs answered {r.status_code}: {r.text[:300]}")
    job = r.json()["id"]
    while True:
        state = client.get(f"/v1/jobs/{job}/wait", params={"timeout": 10}, timeout=30).json()["state"]
        if state in ("done", "failed", "cancelled"):
            break
    wall = time.perf_counter() - t0
    if state != "done":
        raise RuntimeError(f"job {job} ended {state}")
    s2, m2, e2 = cpu_us(sched), cpu_us(sched, sched), sum(cpu_us(p) for p in executors)
    return {"scheduler": (s2 - s0) / n, "submit": (s1 - s0) / n, "main_thread": (m2 - m0) / n,
            "executors": (e2 - e0) / n, "wall_us": wall / n * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--chain", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    tree = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, str(Path(tree) / "bench"))
    import dispatch as d  # the measured tree's own launcher helpers
    import httpx

    runs: dict[str, list[dict[str, float]]] = {"throughput": [], "chain": []}
    with d.triplane_cluster(2) as (url, token), \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60.0) as client:
        info = _cluster_info(url)
        sched, executors = info["scheduler"]["pid"], [e["pid"] for e in info["executors"]]
        d.run_job(client, d.noop_graph(200, salt=10**6), 100)  # warm up
        for r in range(args.repeats):
            runs["throughput"].append(measure(client, sched, executors, d.noop_graph(args.tasks, salt=r),
                                              args.tasks))
            runs["chain"].append(measure(client, sched, executors, d.chain_graph(args.chain, salt=r),
                                         args.chain))
    print(f"tree {tree}; µs of CPU per task (best run by the scheduler's figure; then every run)")
    print("| job | scheduler | of which submit | scheduler main thread | executors | wall µs/task | "
          "scheduler, every run |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for kind, rows in runs.items():
        b = min(rows, key=lambda x: x["scheduler"])
        every = " / ".join(f"{x['scheduler']:.1f}" for x in rows)
        print(f"| {kind} | {b['scheduler']:.1f} | {b['submit']:.1f} | {b['main_thread']:.1f} | "
              f"{b['executors']:.1f} | {b['wall_us']:.1f} | {every} |")
    return 0


def _cluster_info(url: str) -> dict[str, Any]:
    """The newest ``bench-cluster.json`` a ``dispatch.triplane_cluster`` wrote for ``url``."""
    import tempfile

    for f in sorted(Path(tempfile.gettempdir()).glob("triplane-bench-*/bench-cluster.json"),
                    key=lambda f: f.stat().st_mtime, reverse=True):
        info = json.loads(f.read_text())
        if info.get("url") == url:
            return info
    raise RuntimeError(f"no bench-cluster.json names {url}")


if __name__ == "__main__":
    sys.exit(main())
