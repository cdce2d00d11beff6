"""Compute throughput: triplane against numpy, Dask and Ray on the same workloads.

    python bench/compute.py [--systems triplane,numpy,dask,ray] [--repeats 5]
                            [--matmul 4096,8192] [--chain 8192] [--mlp 4096x2048]

Workloads (float32; all inputs are host arrays from one seeded numpy generator, so every
system computes on the same numbers):

* ``matmul N``: ``A @ B`` with A, B of N x N; rate = 2 N^3 / time (GFLOP/s).
* ``chain N``: ``exp(x * 2 + 1).sum()`` on N x N; rate = 4 N^2 bytes read / time (GB/s).
* ``mlp BxW``: one training step of a 3-layer MLP (ReLU, width W, batch B):
  forward, loss ``sum((out - y)^2) / B``, the gradients of the three weights and an SGD
  update; rate = the 8 matmuls' 16 B W^2 flops / time (GFLOP/s).

Systems (bench/README.md says more):

* ``triplane``: a LocalCluster of ``--executors`` executors (1 BLAS thread each). The
  inputs are uploaded (``POST /v1/tensors``) before timing; a timed run is submit ->
  done, fetching only scalars (the matmul's and the MLP's big outputs stay on the cluster,
  as Dask's persisted results and Ray's object refs do). Beside it: the predicted
  makespan from ``GET /v1/jobs/{id}/plan`` and the ratio actual / predicted.
* ``numpy``: one persistent child process, ``--numpy-threads`` (2) BLAS threads: the
  machine's ceiling. It speaks JSON lines on stdin/stdout (:func:`serve_numpy`).
* ``dask``: ``distributed.LocalCluster`` of 2 single-threaded workers, inputs persisted
  before timing, chunks equal to triplane's tiles when its plan says them (else N/4).
* ``ray``: ``ray.init(num_cpus=2)``, hand-written coarse tasks (4 x 4 blocks for matmul,
  16 row blocks for the chain), inputs in the object store before timing; no MLP.

Every requested system is started before anything is measured. Per workload, each system
prepares it (inputs placed) and does a warm-up run, checked against a float64 reference
on sampled blocks (a wrong result fails the row); triplane goes first, since its plan's
tile shape sets Dask's chunks. Then ``--repeats`` rounds: in each, every system does one
timed run, in an order rotated by one per round, so all systems are measured in the same
minutes (this machine's speed drifts by tens of percent over minutes). Then every system
releases the workload's data. A system that fails is marked failed and left out of the
later rounds; the others go on. The table shows best and median, best rates over numpy's,
and the paired ratio: the median over rounds of numpy's time / the system's time in the
same round. Results go to bench/results/compute.{json,md}. With ``--unpin`` (the
default) the OpenBLAS core-type pins (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) are removed
from the child processes' environment; the kernel each system ran is recorded.

Exit codes: 0 done; 1 a result was wrong or triplane failed after starting; 2 the
triplane cluster could not start; 130 interrupted. Every process started is stopped on
the way out, also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python bench/compute.py` from anywhere
from _common import (
    OPENBLAS_PIN_VARS,
    Row,
    fmt,
    machine_facts,
    markdown_table,
    write_results,
)
from compute_systems import (
    NAMES,
    SYSTEMS,
    DaskBaseline,
    NumpyBaseline,
    RayBaseline,
    Refs,
    System,
    failed,
    new_row,
    numpy_child_main,
    record,
    run_times,
    say,
    verify,
)
from compute_workloads import (
    PROBE,
    Workload,
    make_inputs,
    probes,
    reference,
    triplane_outputs,
)


class ClusterStartError(RuntimeError):
    """The triplane cluster did not come up (the message quotes its logs)."""


# --- triplane ----------------------------------------------------------------------------


def tile_shape(plan: dict[str, Any]) -> tuple[int, int] | None:
    """The tile shape of the most-split 2-D tensor of an explain document, if one is split:
    a computed tensor's if any is, else an input's (the chain's upload, read in strips by
    the fused tasks, while its output is one scalar)."""
    made = {t.get("task") for t in plan.get("tasks") or [] if isinstance(t, dict)}
    best: dict[bool, tuple[int, tuple[int, int]]] = {}
    for t in plan.get("tensors") or []:
        tiles = t.get("tiles") or [] if isinstance(t, dict) else []
        if len(tiles) < 2 or not isinstance(tiles[0], dict):
            continue
        ty = tiles[0].get("type")
        if isinstance(ty, dict):
            dims = ty.get("shape")
        else:  # "float32[1024,1024]"
            dims = [int(d) for d in re.findall(r"\d+", str(ty).split("[", 1)[-1])]
        computed = tiles[0].get("tile") in made
        if not (isinstance(dims, list) and len(dims) == 2):
            continue
        if computed not in best or len(tiles) > best[computed][0]:
            best[computed] = (len(tiles), (int(dims[0]), int(dims[1])))
    found = best.get(True) or best.get(False)
    return found[1] if found else None


def _blas_env_of(pid: int) -> str:
    """The BLAS thread settings a running process was started with (Linux /proc)."""
    try:
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode(
            errors="replace").split("\0") if "=" in kv)
    except OSError:
        return "?"
    return " ".join(f"{k}={env.get(k, '-')}" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                        *OPENBLAS_PIN_VARS))


class Triplane:
    """A LocalCluster and a REST session to it; ``close()`` stops every process."""

    key = "triplane"

    def __init__(self, executors: int, memory: str, job_timeout: float) -> None:
        import httpx

        from triplane.launcher.cluster import ClusterConfig, LaunchError, LocalCluster
        from triplane.sdk.remote import RemoteSession

        self.home = Path(tempfile.mkdtemp(prefix="triplane-bench-"))
        self.cluster = LocalCluster(self.home, ClusterConfig(executors=executors, memory=memory),
                                    env={k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                          "MKL_NUM_THREADS")})
        self.session: Any = None
        self.api: Any = None
        try:
            self.cluster.start()
        except LaunchError as e:
            self.close()
            raise ClusterStartError(str(e)) from None
        except BaseException:
            self.close()
            raise
        # cluster.json goes with the cluster; this copy lets the smoke test check every pid.
        (self.home / "bench-cluster.json").write_text(json.dumps(self.cluster.info()))
        self.session = RemoteSession(self.cluster.url, self.cluster.token, timeout_s=120.0,
                                     job_timeout_s=job_timeout)
        self.api = httpx.Client(base_url=self.cluster.url, timeout=30.0,
                                headers={"Authorization": f"Bearer {self.cluster.token}"})
        self.blas = [_blas_env_of(p.pid) for p in self.cluster.executors]
        self.doc: dict[str, Any] | None = None
        self.scalars: list[str] = []

    def close(self) -> None:
        for c in (self.session, self.api):
            with suppress(Exception):
                if c is not None:
                    c.close()
        self.cluster.stop()
        self.cluster.run.clear_cluster()
        if os.environ.get("BENCH_KEEP_HOME") != "1":
            shutil.rmtree(self.home, ignore_errors=True)

    def _upload(self, outputs: Sequence[Any]) -> tuple[dict[str, Any], list[str]]:
        """The canonical graph document with every host input uploaded; output node ids."""
        from triplane.sdk.tensor import build_graph

        graph, _, bindings = build_graph(list(outputs))
        cgraph, rename, args = graph.canonical()
        doc = json.loads(cgraph.to_json())
        for node in doc["nodes"].values():
            if node["op"] == "input":  # attrs.tensor is "arg<i>" after canonical()
                arg = int(node["attrs"]["tensor"][3:])
                node["attrs"]["tensor"] = self.session.upload(bindings[args[arg]])
        return doc, [rename[o._id] for o in outputs]

    def _job(self, doc: dict[str, Any],
             fetch: list[str]) -> tuple[float, str, list[np.ndarray], dict[str, Any] | None]:
        """Submit, wait, fetch ``fetch``: the seconds that took, the job id, the fetched
        values, and the job's plan. The job is deleted (its tiles released) before this returns."""
        start = time.perf_counter()
        job = self.session.submit(doc, fetch)
        try:
            self.session.wait(job)
            vals = [self.session.fetch(job, f) for f in fetch]
            seconds = time.perf_counter() - start
            r = self.api.get(f"/v1/jobs/{job}/plan")
            return seconds, job, vals, r.json() if r.status_code == 200 else None
        finally:
            with suppress(Exception):
                self.api.delete(f"/v1/jobs/{job}")

    def prepare(self, w: Workload, ref: Refs, tile: tuple[int, int] | None) -> Row:
        import triplane as tp

        row = new_row("triplane", w, f"{len(self.cluster.executors)} executors ({self.blas[0]}), inputs "
                                     "uploaded before timing, submit -> done, scalars fetched")
        start = time.perf_counter()
        outs = triplane_outputs(w, {k: tp.tensor(a) for k, a in make_inputs(w).items()})
        self.doc, ids = self._upload(outs)
        row.details[0].update(upload_s=time.perf_counter() - start, executors_blas=self.blas)
        self.scalars = [i for i, o in zip(ids, outs) if o.shape == ()]
        _, _, vals, plan = self._job(self.doc, ids)  # warm-up: compiles, and fetches everything to check it
        tiles = tile_shape(plan) if plan else None
        row.details[0]["tile"] = list(tiles) if tiles else None  # Dask's chunks follow it
        verify(row, w, probes(w, vals), ref)
        return row

    def run(self) -> tuple[float, dict[str, Any]]:
        assert self.doc is not None
        seconds, job, _, plan = self._job(self.doc, self.scalars)
        ms = (plan or {}).get("makespan") or {}
        tiles = tile_shape(plan) if plan else None
        return seconds, {"job": job, "predicted_s": ms.get("predicted_s"),
                         "plan_actual_s": ms.get("actual_s"), "tile": list(tiles) if tiles else None}

    def release(self) -> None:
        # Each job was deleted after its run. The uploaded inputs stay in the executors'
        # upload cache, which any later tile evicts when it needs the room (docs/executor.md).
        self.doc, self.scalars = None, []


# --- rounds ----------------------------------------------------------------------------


def rotation(keys: Sequence[str], r: int) -> list[str]:
    """The order of round ``r``: ``keys`` rotated left by r (round 1 of t,n,d,r: n,d,r,t)."""
    k = r % len(keys) if keys else 0
    return [*keys[k:], *keys[:k]]


def measure(w: Workload, systems: dict[str, System], ref: Refs,
            repeats: int) -> tuple[list[Row], list[list[str]]]:
    """One workload on every system: prepare (in the order of ``systems``), ``repeats``
    rotated rounds of one timed run each, release. The rows, and each round's order."""
    rows: dict[str, Row] = {}
    tile: tuple[int, int] | None = None
    orders: list[list[str]] = []
    for key, s in systems.items():
        say(f"{w.key}: preparing {NAMES[key]} ...")
        try:
            rows[key] = s.prepare(w, ref, tile)
        except Exception as e:  # one system failing must not lose the others' numbers
            rows[key] = new_row(key, w, status=failed(e))
            say(f"{w.key}: {NAMES[key]} {rows[key].status}")
        if key == "triplane" and rows[key].details[0].get("tile"):
            tile = tuple(rows[key].details[0]["tile"])  # type: ignore[assignment]
    live = [k for k in systems if rows[k].status == "ok"]
    for r in range(repeats):
        order = rotation(live, r)  # over the systems still in, so the order keeps rotating
        if not order:
            break
        orders.append(order)
        times = []
        for pos, key in enumerate(order):
            try:
                seconds, extra = systems[key].run()
            except Exception as e:  # left out of the later rounds
                rows[key].status = failed(e)
                live.remove(key)
                times.append(f"{NAMES[key]} {rows[key].status}")
                continue
            record(rows[key], w, seconds, round=r, position=pos, **extra)
            times.append(f"{NAMES[key]} {seconds:.3g} s")
        say(f"{w.key} round {r + 1}/{repeats}: " + ", ".join(times))
    # Not in a `finally`: after Ctrl-C nothing is released but everything is closed, and a
    # busy numpy child is not waited for.
    for key, s in systems.items():
        try:
            s.release()
        except Exception as e:
            say(f"{w.key}: {NAMES[key]} could not release its data: {e}")
    return [rows[k] for k in systems], orders


def paired(row: Row, ref: Row | None) -> float | None:
    """The median over rounds of ``ref``'s time / ``row``'s time in the same round."""
    if ref is None:
        return None
    theirs = {d["round"]: d["seconds"] for d in ref.details[1:] if "round" in d}
    ratios = [theirs[d["round"]] / d["seconds"] for d in row.details[1:]
              if d.get("round") in theirs and d["seconds"] > 0]
    return statistics.median(ratios) if ratios else None


# --- report ------------------------------------------------------------------------------


def _by_workload(rows: list[Row], w: Workload) -> list[Row]:
    return [r for r in rows if r.details and r.details[0].get("workload") == w.key]


def _ok(rows: list[Row], name: str) -> Row | None:
    return next((r for r in rows if r.name == name and r.ok), None)


def table(ws: list[Workload], rows: list[Row]) -> str:
    headers = ["workload", "system", "best s", "median s", "best rate", "median rate", "x numpy",
               "x numpy (paired)"]
    cells = []
    for w in ws:
        group = _by_workload(rows, w)
        ref = _ok(group, NAMES["numpy"])
        for r in group:
            if not r.ok:
                cells.append([w.key, r.name, r.status[:70], "", "", "", "", ""])
                continue
            t = run_times(r)
            ratio = r.best_rate / ref.best_rate if ref and ref.best_rate and r.best_rate else None
            cells.append([w.key, r.name, fmt(min(t), 3), fmt(statistics.median(t), 3),
                          fmt(r.best_rate, 1, f" {w.unit}"), fmt(r.median_rate, 1, f" {w.unit}"),
                          fmt(ratio, 2, "x"), fmt(paired(r, ref), 2, "x")])
    return markdown_table(headers, cells, [False, False, *([True] * 6)])


def predictions(ws: list[Workload], rows: list[Row]) -> tuple[str, list[float]]:
    """The table of triplane's predicted makespans beside the actual; the ratios."""
    cells, ratios = [], []
    for w in ws:
        r = _ok(_by_workload(rows, w), NAMES["triplane"])
        if r is None:
            continue
        best = min((d for d in r.details[1:]), key=lambda d: d["seconds"])
        pred, sched = best.get("predicted_s"), best.get("plan_actual_s")
        ratio = best["seconds"] / pred if pred else None
        if ratio is not None:
            ratios.append(ratio)
        tile = best.get("tile") or r.details[0].get("tile")
        cells.append([w.key, fmt(pred, 3), fmt(best["seconds"], 3), fmt(sched, 3), fmt(ratio, 2, "x"),
                      "x".join(map(str, tile)) if tile else "not split"])
    headers = ["workload", "predicted s", "actual s (submit->done)", "actual s (scheduler)",
               "actual / predicted", "tile"]
    return markdown_table(headers, cells, [False, True, True, True, True, False]), ratios


def targets(ws: list[Workload], rows: list[Row], ratios: list[float]) -> list[str]:
    out = []
    for w in ws:
        group = _by_workload(rows, w)
        trip, ref = _ok(group, NAMES["triplane"]), _ok(group, NAMES["numpy"])
        if trip is None or ref is None or not trip.best_rate or not ref.best_rate:
            continue
        x = trip.best_rate / ref.best_rate
        if w.kind == "matmul":
            rivals = [r for r in (_ok(group, NAMES["dask"]), _ok(group, NAMES["ray"])) if r and r.best_rate]
            ahead = all(trip.best_rate > r.best_rate for r in rivals)  # type: ignore[operator]
            met = x >= 0.9 and ahead
            names = " and ".join(r.name for r in rivals) or "no baseline"
            pair = fmt(paired(trip, ref), 2, "x")
            out.append(f"* {w.key}: triplane {x:.2f}x numpy's throughput (paired {pair}; target >= 0.90), "
                       f"{'ahead of' if ahead else 'NOT ahead of'} {names} -- "
                       f"{'met' if met else 'NOT met'}")
        elif w.kind == "chain":
            tx = min(run_times(trip)) / min(run_times(ref))
            out.append(f"* {w.key}: triplane's time {tx:.2f}x numpy's (target < 0.70) -- "
                       f"{'met' if tx < 0.7 else 'NOT met'}")
    if ratios:
        worst = max(max(r, 1 / r) for r in ratios)
        out.append(f"* predicted makespan within 1.5x of the actual: worst factor {worst:.2f} -- "
                   f"{'met' if worst <= 1.5 else 'NOT met'}")
    else:
        out.append("* predicted makespan: not available (GET /v1/jobs/{id}/plan answered no plan)")
    return out


def report(ws: list[Workload], rows: list[Row], args: argparse.Namespace, facts: dict[str, Any]) -> str:
    pred, ratios = predictions(ws, rows)
    lines = [
        "# Compute benchmark (bench/compute.py)", "",
        f"float32; per workload, a warm-up per system whose results were checked against float64 on "
        f"sampled blocks, then {args.repeats} rounds of one timed run per system, the order rotated "
        "each round; rates are GFLOP/s (matmul, mlp) or GB/s read (chain); x numpy compares best "
        "rates; x numpy (paired) is the median over rounds of numpy's time / the system's time in "
        "the same round.", "",
        table(ws, rows), "",
        "triplane's predicted makespan (GET /v1/jobs/{id}/plan) beside the actual, best run:", "",
        pred, "", "Targets (issue 4):", *targets(ws, rows, ratios), "",
        "Machine: " + ", ".join(f"{k} {facts[k]}" for k in ("nproc", "cpu", "system", "python", "commit")
                                if facts.get(k) is not None),
        "Versions: " + ", ".join(f"{k} {v}" for k, v in facts["versions"].items() if v),
        f"OpenBLAS pins in the environment: {facts['openblas_pins'] or 'none'}; "
        f"{'removed' if args.unpin else 'kept'} for the child processes.", "",
    ]
    seen = set()
    for r in rows:
        if r.notes and (r.name, r.notes) not in seen:
            seen.add((r.name, r.notes))
            lines.append(f"* {r.name} ({r.details[0]['workload']}): {r.notes}")
    return "\n".join(lines)


# --- command line ------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds, one run per system each (default 5)")
    p.add_argument("--matmul", default="4096,8192", help="matmul sides (default 4096,8192; '' none)")
    p.add_argument("--chain", default="8192", help="elementwise chain sides (default 8192; '' none)")
    p.add_argument("--mlp", default="4096x2048", help="MLP step BATCHxWIDTH, comma-separated ('' none)")
    p.add_argument("--executors", type=int, default=2, help="triplane executors (default 2)")
    p.add_argument("--memory", default="6GiB", help="tile memory per executor (default 6GiB)")
    p.add_argument("--numpy-threads", type=int, default=2, help="BLAS threads of the numpy row")
    p.add_argument("--job-timeout", type=float, default=300.0,
                   help="seconds one triplane job, or one numpy child request, may take")
    p.add_argument("--keep-blas-env", dest="unpin", action="store_false",
                   help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the child processes (tests, CI)")
    p.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="compute", help="result file stem (default compute)")
    p.add_argument("--numpy-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.numpy_child:
        return args
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown system(s) {sorted(unknown)} (known: {', '.join(SYSTEMS)})")
    try:
        ws = [Workload("matmul", n) for n in _ints(args.matmul)]
        ws += [Workload("chain", n) for n in _ints(args.chain)]
        for spec in filter(None, (s.strip() for s in args.mlp.split(","))):
            batch, width = spec.lower().split("x")
            ws.append(Workload("mlp", int(batch), int(width)))
    except ValueError:
        p.error("--matmul/--chain take comma-separated ints, --mlp BATCHxWIDTH")
    if any(min(w.n, w.width or w.n) < PROBE for w in ws):
        p.error(f"every size must be at least {PROBE} (the checked blocks are {PROBE}x{PROBE})")
    try:
        from triplane.executor.config import parse_size

        parse_size(args.memory)
    except (ImportError, ValueError) as e:
        p.error(f"--memory: {e}")
    if min(args.repeats, args.executors, args.numpy_threads) < 1:
        p.error("--repeats, --executors and --numpy-threads must be >= 1")
    if args.job_timeout <= 0:
        p.error("--job-timeout must be > 0")
    args.workloads = ws
    return args


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwind through every `finally`, which stops what we started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.numpy_child:
        return numpy_child_main()
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def start(key: str, args: argparse.Namespace) -> System | str:
    """Start one baseline; it, or the status its rows get when it cannot start."""
    say(f"starting {NAMES[key]} ...")
    try:
        if key == "numpy":
            return NumpyBaseline(args.numpy_threads, args.unpin, args.job_timeout)
        if key == "dask":
            try:
                import dask.array  # noqa: F401
                import distributed  # noqa: F401
            except ImportError:
                return "not installed (pip install 'dask[distributed]')"
            return DaskBaseline()
        try:
            import ray  # noqa: F401
        except ImportError:
            return "not installed (pip install ray)"
        return RayBaseline(args.workloads)
    except Exception as e:  # a baseline that cannot start must not lose the others' numbers
        say(f"{NAMES[key]} {failed(e)}")
        return failed(e)


def _run(args: argparse.Namespace) -> int:
    pins = {k: os.environ[k] for k in OPENBLAS_PIN_VARS if k in os.environ}
    if args.unpin:  # only processes started from now on see it; this one computes no timings
        for k in OPENBLAS_PIN_VARS:
            os.environ.pop(k, None)
    ws: list[Workload] = args.workloads
    say("float64 references ...")
    refs = {w.key: reference(w, make_inputs(w)) for w in ws}
    rows: list[Row] = []
    orders: dict[str, list[list[str]]] = {}
    with ExitStack() as stack:  # closes every started system on any way out
        systems: dict[str, System] = {}
        absent: dict[str, str] = {}
        if "triplane" in args.systems:
            say("starting triplane ...")
            try:
                systems["triplane"] = Triplane(args.executors, args.memory, args.job_timeout)
            except ClusterStartError as e:
                print(f"error: the triplane cluster could not start: {e}", file=sys.stderr)
                return 2
            stack.callback(_close, systems["triplane"])
        for key in SYSTEMS[1:]:
            if key in args.systems:
                got = start(key, args)
                if isinstance(got, str):
                    absent[key] = got
                else:
                    systems[key] = got
                    stack.callback(_close, got)
        for w in ws:
            measured, orders[w.key] = measure(w, systems, refs[w.key], args.repeats)
            by_key = dict(zip(systems, measured))
            rows += [by_key[k] if k in by_key else new_row(k, w, status=absent[k])
                     for k in SYSTEMS if k in args.systems]
    code = 0
    if any(r.status.startswith("wrong result") for r in rows) or \
            any(r.name == NAMES["triplane"] and not r.ok for r in rows):
        code = 1
    facts = machine_facts(["numpy", "httpx", "fastapi", "uvicorn", "uvloop", "dask", "distributed", "ray",
                           "threadpoolctl"])
    facts["openblas_pins"] = pins
    text = report(ws, rows, args, facts)
    print(text)
    numpy_of = {r.details[0]["workload"]: r for r in rows if r.name == NAMES["numpy"] and r.ok}
    payload = {"benchmark": "compute", "repeats": args.repeats, "executors": args.executors,
               "numpy_threads": args.numpy_threads, "unpinned": args.unpin,
               "workloads": [{**asdict(w), "key": w.key, "unit": w.unit, "work": w.work} for w in ws],
               "orders": orders,  # per workload, each round's order of systems
               "machine": facts,
               "rows": [{**r.summary(), "seconds": run_times(r),
                         "x_numpy_paired": paired(r, numpy_of.get(r.details[0]["workload"])) if r.ok
                         else None}
                        for r in rows]}
    jpath, mpath = write_results(args.name, payload, text, args.results_dir)
    say(f"\nwrote {jpath} and {mpath}")
    return code


def _close(system: System) -> None:
    try:
        system.close()
    except Exception as e:  # the others are closed all the same
        say(f"closing {NAMES[system.key]} failed: {e}")


if __name__ == "__main__":
    sys.exit(main())
