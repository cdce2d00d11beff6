"""The REST API under load: list endpoints' latency while a 100,000-task job runs, and the
dispatch rate with an event-stream client and a metrics scraper attached.

    python bench/api.py [--big 100000] [--tasks 20000] [--repeats 3] [--requests 200]

One local cluster (``triplane up``, ``--executors`` executors), two parts, in this run:

* **latency**: a job of ``--big`` independent no-op tasks is submitted (bench/dispatch.py's
  throughput graph); while it runs, the paginated list endpoints are asked in turn, one
  request at a time, ``limit=50`` (``GET /v1/jobs``, ``/v1/jobs/{job}/tasks``,
  ``/v1/events``, ``/v1/nodes``) until each has answered ``--requests`` times or the job
  ended. A route this build does not serve (404 for the route itself) is reported as such.
  Target (issue 13): p99 under 100 ms for each.
* **dispatch with observers**: jobs of ``--tasks`` no-op tasks, alternately with nothing
  attached and with an SSE client following ``GET /v1/events`` (every event read and
  parsed) plus a scraper reading ``GET /metrics`` every ``--scrape-s`` seconds (both in
  threads of this process); tasks/s = tasks / (submit -> done), ``--repeats`` of each.
  Target (issue 13): the median rate with observers at least 90% of the median without.

Results go to bench/results/api.{json,md} (``--results-dir``, ``--name``), with the load
average when each part ended: on a shared machine other processes' load moves every figure
(bench/README.md). Every process started is stopped on the way out (bench/dispatch.py's
``triplane_cluster``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python bench/api.py` from anywhere
from _common import fmt, machine_facts, markdown_table, write_results
from dispatch import ClusterStartError, noop_graph, run_job, triplane_cluster

ROUTES = ("/v1/jobs", "/v1/jobs/{job}/tasks", "/v1/events", "/v1/nodes")
P99_TARGET_MS = 100.0
RATIO_TARGET = 0.9


def percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def submit(client: Any, graph: dict[str, Any]) -> str:
    body = json.dumps({"graph": graph, "fetch": []}, separators=(",", ":")).encode()
    r = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"}, timeout=600.0)
    if r.status_code != 201:
        raise RuntimeError(f"POST /v1/jobs answered {r.status_code}: {r.text[:500]}")
    return str(r.json()["id"])


def served(client: Any, path: str) -> bool:
    """Whether this build has the route (a 404 naming the job would still be 'served')."""
    r = client.get(path, params={"limit": 1})
    return not (r.status_code == 404 and r.json().get("error", {}).get("message") == "Not Found")


def latency(client: Any, big: int, requests: int) -> dict[str, Any]:
    """Submit the big job and time the list routes while it runs."""
    t0 = time.perf_counter()
    job = submit(client, noop_graph(big, salt=7))
    submit_s = time.perf_counter() - t0
    paths = {r: r.format(job=job) for r in ROUTES}
    times: dict[str, list[float]] = {r: [] for r in ROUTES if served(client, paths[r])}
    done_during = False
    while any(len(v) < requests for v in times.values()):
        state = client.get(f"/v1/jobs/{job}").json()["state"]
        if state != "running":
            done_during = True
            break
        for route, ts in times.items():
            start = time.perf_counter()
            r = client.get(paths[route], params={"limit": 50})
            ts.append((time.perf_counter() - start) * 1e3)
            if r.status_code != 200:
                raise RuntimeError(f"GET {paths[route]} answered {r.status_code}: {r.text[:300]}")
    progress = client.get(f"/v1/jobs/{job}").json()["progress"]
    load = os.getloadavg()[0]
    client.delete(f"/v1/jobs/{job}")  # cancel what is left: the next part wants the cluster
    return {"job": job, "tasks": big, "submit_s": submit_s, "ended_early": done_during, "load": load,
            "progress": progress, "missing": [r for r in ROUTES if r not in times],
            "ms": {r: {"n": len(v), "p50": statistics.median(v), "p99": percentile(v, 0.99),
                       "max": max(v)} for r, v in times.items() if v}}


class Observers:
    """An SSE client following every event and a /metrics scraper, in threads."""

    def __init__(self, url: str, token: str, scrape_s: float) -> None:
        self.url, self.auth, self.scrape_s = url, {"Authorization": f"Bearer {token}"}, scrape_s
        self.stop = threading.Event()
        self.events = self.scrapes = 0
        self.threads = [threading.Thread(target=self._follow, daemon=True),
                        threading.Thread(target=self._scrape, daemon=True)]

    def __enter__(self) -> Observers:
        for t in self.threads:
            t.start()
        time.sleep(0.3)  # the stream is subscribed
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)

    def _follow(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, headers=self.auth, timeout=httpx.Timeout(5.0, read=None)) as c, \
                c.stream("GET", "/v1/events", headers={"Accept": "text/event-stream"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    json.loads(line[6:])
                    self.events += 1
                if self.stop.is_set():
                    return

    def _scrape(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, headers=self.auth, timeout=10.0) as c:
            while not self.stop.wait(self.scrape_s):
                c.get("/metrics").raise_for_status()
                self.scrapes += 1


def scheduler_pid(url: str) -> int | None:
    """The pid of the process listening on ``url``'s port (``ss``; None where it is missing)."""
    import re
    import subprocess

    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{url.rsplit(':', 1)[1]}"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    pids = re.findall(r"pid=(\d+)", out)
    return int(pids[0]) if pids else None


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used; 0 when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def observed_rates(client: Any, url: str, token: str, n: int, repeats: int,
                   scrape_s: float) -> dict[str, Any]:
    """Rates (tasks/s) and the scheduler's CPU seconds per job, with and without observers:
    the CPU is the steadier figure where other processes share the machine."""
    out: dict[str, Any] = {"without": [], "with": [], "events": 0, "scrapes": 0, "load": [],
                           "cpu_without": [], "cpu_with": []}
    pid = scheduler_pid(url)
    run_job(client, noop_graph(min(n, 500), salt=10**6), 120.0)  # warm up
    for r in range(repeats):
        for attached in (False, True):  # alternated: drift of the machine hits both alike
            graph = noop_graph(n, salt=100 + 2 * r + attached)
            before = cpu_s(pid)
            if attached:
                with Observers(url, token, scrape_s) as obs:
                    t = run_job(client, graph, 60.0 + n / 100)
                out["events"] += obs.events
                out["scrapes"] += obs.scrapes
            else:
                t = run_job(client, graph, 60.0 + n / 100)
            out["with" if attached else "without"].append(n / t["total"])
            out["cpu_with" if attached else "cpu_without"].append(cpu_s(pid) - before)
            out["load"].append(os.getloadavg()[0])
    return out


def report(lat: dict[str, Any], rates: dict[str, Any], args: argparse.Namespace,
           facts: dict[str, Any]) -> str:
    rows = []
    for route in ROUTES:
        m = lat["ms"].get(route)
        if m is None:
            rows.append([route, "not served by this build", "", "", "", ""])
            continue
        ok = m["p99"] < P99_TARGET_MS
        rows.append([route, str(m["n"]), fmt(m["p50"], 1), fmt(m["p99"], 1), fmt(m["max"], 1),
                     f"{m['p99'] / P99_TARGET_MS:.2f}x of 100 ms ({'met' if ok else 'NOT met'})"])
    without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
    ratio = with_ / without
    lines = [
        "# REST API under load (bench/api.py)", "",
        f"Latency while a {args.big:,}-task job ran (limit=50, one request at a time; "
        f"submit took {lat['submit_s']:.1f} s; progress when measuring ended: "
        f"{lat['progress']['done']:,} of {lat['progress']['total']:,} tasks; load average "
        f"{lat['load']:.1f} on {facts['nproc']} CPUs"
        + ("; the job ended before every route had its requests" if lat["ended_early"] else "") + "):", "",
        markdown_table(["route", "requests", "p50 ms", "p99 ms", "max ms", "p99 / target"], rows,
                       [False, True, True, True, True, False]), "",
        f"Dispatch rate, {args.tasks:,} no-op tasks per job, {args.repeats} jobs each way, alternated:", "",
        markdown_table(["run", "tasks/s (each)", "median", "ratio"],
                       [["nothing attached", ", ".join(fmt(x) for x in rates["without"]), fmt(without),
                         "1.00"],
                        [f"SSE client + /metrics every {args.scrape_s:g} s",
                         ", ".join(fmt(x) for x in rates["with"]), fmt(with_), f"{ratio:.2f}"]],
                       [False, False, True, True]), "",
        *([f"Scheduler CPU per job (steadier than the rate on a shared machine): "
           f"{statistics.median(rates['cpu_without']):.2f} s without, "
           f"{statistics.median(rates['cpu_with']):.2f} s with observers "
           f"({statistics.median(rates['cpu_with']) / statistics.median(rates['cpu_without']):.2f}x; "
           f"the observers' requests included)."] if all(rates["cpu_without"]) else []),
        f"The SSE client read {rates['events']:,} events and the scraper made {rates['scrapes']:,} scrapes; "
        f"load average {min(rates['load']):.1f} to {max(rates['load']):.1f} over the jobs.",
        f"Target (issue 13): ratio >= {RATIO_TARGET:.2f}: {ratio:.2f} -- "
        f"{'met' if ratio >= RATIO_TARGET else 'NOT met'}.", "",
        "Machine: " + ", ".join(f"{k} {facts[k]}" for k in ("nproc", "cpu", "system", "python", "commit")
                                if facts.get(k) is not None),
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--big", type=int, default=100_000, help="tasks of the job the latency runs beside")
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per job of the rate part")
    p.add_argument("--repeats", type=int, default=3, help="jobs with and without observers (each)")
    p.add_argument("--requests", type=int, default=200, help="requests per route in the latency part")
    p.add_argument("--scrape-s", type=float, default=1.0, help="seconds between /metrics scrapes")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="api", help="result file stem (default api)")
    args = p.parse_args(argv)
    if min(args.big, args.tasks, args.repeats, args.requests, args.executors) < 1 or args.scrape_s <= 0:
        p.error("every count must be >= 1 and --scrape-s > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    import httpx

    args = parse_args(argv)
    try:
        with triplane_cluster(args.executors) as (url, token), \
                httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                             timeout=60.0) as client:
            print("latency beside the big job ...", file=sys.stderr, flush=True)
            lat = latency(client, args.big, args.requests)
            print("dispatch rates with and without observers ...", file=sys.stderr, flush=True)
            rates = observed_rates(client, url, token, args.tasks, args.repeats, args.scrape_s)
    except ClusterStartError as e:
        print(f"error: the triplane cluster could not start: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        return 130
    facts = machine_facts(["httpx", "fastapi", "uvicorn", "uvloop", "prometheus-client"])
    text = report(lat, rates, args, facts)
    print(text)
    payload = {"benchmark": "api", "args": {k: str(v) for k, v in vars(args).items()}, "latency": lat,
               "rates": rates, "machine": facts}
    jpath, mpath = write_results(args.name, payload, text, args.results_dir)
    print(f"\nwrote {jpath} and {mpath}", file=sys.stderr)
    missed = any(m["p99"] >= P99_TARGET_MS for m in lat["ms"].values())
    slower = statistics.median(rates["with"]) < RATIO_TARGET * statistics.median(rates["without"])
    return 1 if missed or slower else 0


if __name__ == "__main__":
    sys.exit(main())
