"""The dashboard beside a 100,000-task job: does the page stay interactive, and what does it
cost the scheduler's dispatch rate?

    python bench/dashboard.py [--tasks 100000] [--repeats 2] [--executors 2]

One local cluster (``triplane up``) and one headless Chromium (Debian's ``/usr/bin/chromium``
driven by Playwright; ``--chromium``), in this run. Jobs of ``--tasks`` independent no-op
tasks (bench/dispatch.py's throughput graph), alternately with no page open and with the
dashboard's job page of that very job open in the browser (opened as soon as the submit
answers; it follows the event stream, redraws the progress on each ``job.progress`` event
and refetches the timeline aggregates at most every 2 s). ``--repeats`` jobs each way.

* **dispatch rate**: tasks / (submit -> done) seconds, the median of each way and their
  ratio. Target (issue 17): with the page at least 90% of without.
* **render time**: measured in the browser with ``performance.now()``: from an event's
  arrival to the page updated (``window.__tp.renders``), the timeline redrawn from new
  aggregates (``window.__tp.draws``), and a whole timeline refresh (the request, the
  server's aggregates, the redraw: ``window.__tp.timeline``; a request waits on the
  scheduler, so it is reported beside, not held to the target); p50, p95, max. Target: an
  update rendered in under 200 ms. Also the browser's long tasks (over 50 ms).

Results go to bench/results/dashboard.{json,md}, with the load average: on a shared machine
other processes move every figure (bench/README.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python bench/dashboard.py` from anywhere
from _common import fmt, machine_facts, markdown_table, write_results
from api import cpu_s, percentile, scheduler_pid, submit
from dispatch import ClusterStartError, noop_graph, run_job, triplane_cluster

RATIO_TARGET = 0.9
RENDER_TARGET_MS = 200.0
LONGTASKS = """() => { window.__long = []; new PerformanceObserver((l) => { for (const e of l.getEntries())
  window.__long.push(e.duration); }).observe({ type: "longtask", buffered: true }); }"""


def wait_done(client: Any, job: str, timeout: float) -> None:
    end_by = time.perf_counter() + timeout
    while time.perf_counter() < end_by:
        state = client.get(f"/v1/jobs/{job}/wait", params={"timeout": 5}).json()["state"]
        if state == "done":
            return
        if state in ("failed", "cancelled"):
            raise RuntimeError(f"job {job} ended {state}")
    raise RuntimeError(f"job {job} did not end within {timeout:.0f} s")


def with_page(client: Any, page: Any, n: int, salt: int) -> tuple[float, dict[str, list[float]]]:
    """One job with its page open; (tasks/s, the browser's figures for it)."""
    page.evaluate("() => { window.__tp.renders = []; window.__tp.timeline = []; window.__tp.draws = []; "
                  "window.__long = []; }")
    start = time.perf_counter()
    job = submit(client, noop_graph(n, salt=salt))
    page.evaluate("h => { location.hash = h; }", f"#/job/{job}")
    wait_done(client, job, 60.0 + n / 100)
    rate = n / (time.perf_counter() - start)
    page.wait_for_selector("#job-state .s-done", timeout=30000)
    page.wait_for_timeout(2500)  # the last throttled timeline refresh
    figures = page.evaluate("() => ({renders: window.__tp.renders, timeline: window.__tp.timeline || [], "
                            "draws: window.__tp.draws || [], long: window.__long, "
                            "events: window.__tp.events})")
    page.evaluate("h => { location.hash = h; }", "#/ops")  # leave the job page between jobs
    return rate, figures


def measure(url: str, token: str, client: Any, args: argparse.Namespace) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {"without": [], "with": [], "renders": [], "timeline": [], "draws": [], "long": [],
                           "load": [], "events": 0, "cpu_without": [], "cpu_with": []}
    pid = scheduler_pid(url)
    run_job(client, noop_graph(500, salt=10**6), 120.0)  # warm up
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(url + "/")
        page.fill("#token-input", token)
        page.press("#token-input", "Enter")
        page.wait_for_selector("#conn[data-state=live]", timeout=30000)
        page.evaluate(LONGTASKS)
        page.evaluate("h => { location.hash = h; }", "#/ops")
        for r in range(args.repeats):
            for attached in (False, True):  # alternated: drift of the machine hits both alike
                salt = 100 + 2 * r + attached
                print(f"job {r + 1}/{args.repeats} {'with' if attached else 'without'} the page ...",
                      file=sys.stderr, flush=True)
                before = cpu_s(pid)
                if attached:
                    rate, fig = with_page(client, page, args.tasks, salt)
                    out["renders"] += fig["renders"]
                    out["timeline"] += fig["timeline"]
                    out["draws"] += fig["draws"]
                    out["long"] += fig["long"]
                    out["events"] += fig["events"]
                else:
                    t = run_job(client, noop_graph(args.tasks, salt=salt), 60.0 + args.tasks / 100)
                    rate = args.tasks / t["total"]
                out["with" if attached else "without"].append(rate)
                out["cpu_with" if attached else "cpu_without"].append(cpu_s(pid) - before)
                out["load"].append(os.getloadavg()[0])
        browser.close()
    out["console_errors"] = errors
    return out


def stats(xs: list[float]) -> list[str]:
    if not xs:
        return ["0", "-", "-", "-"]
    return [str(len(xs)), fmt(statistics.median(xs), 1), fmt(percentile(xs, 0.95), 1), fmt(max(xs), 1)]


def report(m: dict[str, Any], args: argparse.Namespace, facts: dict[str, Any]) -> str:
    without, with_ = statistics.median(m["without"]), statistics.median(m["with"])
    ratio = with_ / without
    worst = max(m["renders"] + m["draws"], default=0.0)
    return "\n".join([
        "# The dashboard beside a big job (bench/dashboard.py)", "",
        f"Dispatch rate, {args.tasks:,} no-op tasks per job, {args.repeats} jobs each way, alternated, "
        f"{args.executors} executors; the job page of the running job open in headless Chromium "
        "(1280 px):", "",
        markdown_table(["run", "tasks/s (each)", "median", "ratio"],
                       [["no page open", ", ".join(fmt(x) for x in m["without"]), fmt(without), "1.00"],
                        ["job page open", ", ".join(fmt(x) for x in m["with"]), fmt(with_), f"{ratio:.2f}"]],
                       [False, False, True, True]), "",
        "Render times in the browser (performance.now(), milliseconds):", "",
        markdown_table(["what", "count", "p50 ms", "p95 ms", "max ms"],
                       [["an event -> the page updated", *stats(m["renders"])],
                        ["the timeline redrawn from new aggregates", *stats(m["draws"])],
                        ["timeline refresh: request + server aggregates + redraw", *stats(m["timeline"])],
                        ["long tasks of the page (> 50 ms)", *stats(m["long"])]],
                       [False, True, True, True, True]), "",
        *([f"Scheduler CPU per job (steadier than the rate on a shared machine): "
           f"{statistics.median(m['cpu_without']):.2f} s without, {statistics.median(m['cpu_with']):.2f} s "
           f"with the page ({statistics.median(m['cpu_with']) / statistics.median(m['cpu_without']):.2f}x; "
           "the page's requests included)."] if all(m["cpu_without"]) else []),
        f"The page read {m['events']:,} events; console errors: {len(m['console_errors'])}; "
        f"load average {min(m['load']):.1f} to {max(m['load']):.1f} over the jobs.",
        f"Targets (issue 17): ratio >= {RATIO_TARGET:.2f}: {ratio:.2f} -- "
        f"{'met' if ratio >= RATIO_TARGET else 'NOT met'}; every update under {RENDER_TARGET_MS:.0f} ms: "
        f"worst {worst:.1f} ms -- {'met' if worst < RENDER_TARGET_MS else 'NOT met'}.", "",
        "Machine: " + ", ".join(f"{k} {facts[k]}" for k in ("nproc", "cpu", "system", "python", "commit")
                                if facts.get(k) is not None),
    ])


def main(argv: list[str] | None = None) -> int:
    import httpx

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="dashboard")
    args = p.parse_args(argv)
    if min(args.tasks, args.repeats, args.executors) < 1:
        p.error("every count must be >= 1")
    try:
        with triplane_cluster(args.executors) as (url, token), \
                httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                             timeout=600.0) as client:
            m = measure(url, token, client, args)
    except ClusterStartError as e:
        print(f"error: the triplane cluster could not start: {e}", file=sys.stderr)
        return 2
    facts = machine_facts(["httpx", "fastapi", "uvicorn", "playwright"])
    text = report(m, args, facts)
    print(text)
    payload = {"benchmark": "dashboard", "args": {k: str(v) for k, v in vars(args).items()}, "measured": m,
               "machine": facts}
    jpath, mpath = write_results(args.name, payload, text, args.results_dir)
    print(f"\nwrote {jpath} and {mpath}", file=sys.stderr)
    ratio = statistics.median(m["with"]) / statistics.median(m["without"])
    worst = max(m["renders"] + m["draws"], default=0.0)
    return 0 if ratio >= RATIO_TARGET and worst < RENDER_TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
