"""Compute throughput: triplane against numpy, Dask and Ray on the same workloads.

    python bench/compute.py [--systems triplane,numpy,dask,ray] [--repeats 3]
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
* ``numpy``: one child process, ``--numpy-threads`` (2) BLAS threads: the machine's ceiling.
* ``dask``: ``distributed.LocalCluster`` of 2 single-threaded workers, inputs persisted
  before timing, chunks equal to triplane's tiles when its plan says them (else N/4).
* ``ray``: ``ray.init(num_cpus=2)``, hand-written coarse tasks (4 x 4 blocks for matmul,
  16 row blocks for the chain), inputs in the object store before timing; no MLP.

Each system does a warm-up run (its results are checked against a float64 reference on
sampled blocks: a wrong result fails the row), then ``--repeats`` timed runs; the table
shows best and median. Results go to bench/results/compute.{json,md}. With ``--unpin``
(the default) the OpenBLAS core-type pins (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) are
removed from the child processes' environment; the kernel each system ran is recorded.

Exit codes: 0 done; 1 a result was wrong or triplane failed after starting; 2 the
triplane cluster could not start; 130 interrupted. Every process started is stopped on
the way out, also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python bench/compute.py` from anywhere
from _common import (
    OPENBLAS_PIN_VARS,
    Row,
    blas_env,
    blas_info,
    fmt,
    machine_facts,
    markdown_table,
    write_results,
)
from compute_workloads import (
    _FIRST,
    PROBE,
    Workload,
    _index,
    check,
    compute,
    make_inputs,
    probes,
    reference,
    triplane_outputs,
)

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("triplane", "numpy", "dask", "ray")
NAMES = {"triplane": "triplane", "numpy": "numpy", "dask": "Dask distributed", "ray": "Ray"}
RAY_BLOCKS = 4  # per side: 16 coarse tasks


class ClusterStartError(RuntimeError):
    """The triplane cluster did not come up (the message quotes its logs)."""


def new_row(system: str, w: Workload, notes: str = "", status: str = "ok") -> Row:
    row = Row(NAMES[system], notes=notes, status=status)
    row.details.append({"workload": w.key})  # details[0] describes the row; runs follow
    return row


def record(row: Row, w: Workload, seconds: float, **extra: Any) -> None:
    row.rates.append(w.work / seconds / 1e9)
    row.details.append({"seconds": seconds, **extra})


def verify(row: Row, w: Workload, got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    problem = check(w, got, ref)
    if problem is not None:
        row.status = f"wrong result: {problem}"


def run_times(row: Row) -> list[float]:
    return [d["seconds"] for d in row.details if "seconds" in d]


# --- numpy (a child process with its own BLAS threads) -----------------------------------


def numpy_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child: warm-up, then timed runs of every workload; JSON-ready."""
    out: dict[str, Any] = {"blas": blas_info(), "results": {}}
    for wd in spec["workloads"]:
        w = Workload(**wd)
        v = make_inputs(w)
        got = probes(w, compute(w, v, np))
        times = []
        for _ in range(spec["repeats"]):
            start = time.perf_counter()
            compute(w, v, np)
            times.append(time.perf_counter() - start)
        out["results"][w.key] = {"seconds": times, "probes": {k: a.tolist() for k, a in got.items()}}
    return out


def bench_numpy(ws: list[Workload], repeats: int, threads: int, unpin: bool,
                refs: dict[str, dict[str, np.ndarray]], timeout: float) -> list[Row]:
    spec = json.dumps({"workloads": [asdict(w) for w in ws], "repeats": repeats})
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--numpy-child", spec],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=blas_env(threads, unpin=unpin))
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the numpy child exited {proc.returncode}: {err.strip()[-800:]}")
    data = json.loads(out.strip().splitlines()[-1])
    kernel = ", ".join(f"{b['internal_api']} {b['architecture']} x{b['num_threads']}" for b in data["blas"])
    rows = []
    for w in ws:
        r = data["results"][w.key]
        row = new_row("numpy", w, f"1 process, {kernel or 'BLAS unknown'}")
        row.details[0]["blas"] = data["blas"]
        for s in r["seconds"]:
            record(row, w, s)
        verify(row, w, {k: np.asarray(a) for k, a in r["probes"].items()}, refs[w.key])
        rows.append(row)
    return rows


# --- Dask ------------------------------------------------------------------------------


def bench_dask(ws: list[Workload], repeats: int, refs: dict[str, dict[str, np.ndarray]],
               chunks: dict[str, tuple[int, int]]) -> list[Row]:
    try:
        import dask.array  # noqa: F401
        from distributed import Client, LocalCluster
    except ImportError:
        return [new_row("dask", w, status="not installed (pip install 'dask[distributed]')") for w in ws]
    import warnings

    # The inputs travel once, from this process, before timing: that is the point here.
    warnings.filterwarnings("ignore", message="Sending large graph")
    rows = []
    # The nanny gives each worker 1 BLAS thread (distributed.nanny.pre-spawn-environ).
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        kernels = client.run(blas_info)
        for w in ws:
            rows.append(_dask_workload(client, w, repeats, refs[w.key], chunks.get(w.key), kernels))
    return rows


def _same(block: np.ndarray) -> np.ndarray:
    return block


def _dask_workload(client: Any, w: Workload, repeats: int, ref: dict[str, np.ndarray],
                   chunks: tuple[int, int] | None, kernels: dict[str, Any]) -> Row:
    import dask.array as da
    from distributed import wait

    ch = chunks or w.default_chunks()
    row = new_row("dask", w, f"LocalCluster(2 workers x 1 thread), chunks {ch[0]}x{ch[1]}, inputs persisted")
    row.details[0].update(chunks=list(ch), blas=list(kernels.values()))
    v = {k: client.persist(da.from_array(a, chunks=ch)) for k, a in make_inputs(w).items()}
    wait(list(v.values()))

    runs = iter(range(1 << 30))

    def run() -> list[Any]:
        # Dask names results by a hash of their graph, and a persist whose keys are still in
        # memory (the previous run's) returns at once without computing. A per-run identity
        # over each input (no copy) makes every key new, so every run computes.
        tag = next(runs)
        fresh = {k: a.map_blocks(_same, dtype=a.dtype, name=f"{k}-run{tag}") for k, a in v.items()}
        outs = client.persist(compute(w, fresh, da))
        wait(outs)
        return outs

    verify(row, w, probes(w, run(), lambda o, idx: o[idx].compute()), ref)
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        record(row, w, time.perf_counter() - start)
    return row


# --- Ray -------------------------------------------------------------------------------


def _ray_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


def _ray_chain(x: np.ndarray) -> np.float32:
    return np.exp(x * 2 + 1).sum()


def bench_ray(ws: list[Workload], repeats: int, refs: dict[str, dict[str, np.ndarray]]) -> list[Row]:
    try:
        import ray
    except ImportError:
        return [new_row("ray", w, status="not installed (pip install ray)") for w in ws]
    biggest = max((4 * w.n * max(w.n, w.width) for w in ws), default=0)
    ours = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             object_store_memory=int(min(6 << 30, max(256 << 20, 6 * biggest))),
             # 1 BLAS thread per task; bench/ on the path so workers can import _common
             runtime_env={"env_vars": {**{k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                           "MKL_NUM_THREADS")},
                                       "PYTHONPATH": os.pathsep.join([str(REPO / "bench"), str(REPO)])}})
    if callable(ours):  # ray.init's SIGTERM handler dies on the spot; ours unwinds (shutdown)
        signal.signal(signal.SIGTERM, ours)
    rows = []
    try:
        mm, chain, info = ray.remote(_ray_matmul), ray.remote(_ray_chain), ray.remote(blas_info)
        kernels = ray.get(info.remote())
        for w in ws:
            if w.kind == "mlp":
                rows.append(new_row("ray", w, status="n/a (no hand-written MLP step)"))
                continue
            rows.append(_ray_workload(ray, mm, chain, w, repeats, refs[w.key], kernels))
    finally:
        ray.shutdown()
    return rows


def _ray_workload(ray: Any, mm: Any, chain: Any, w: Workload, repeats: int, ref: dict[str, np.ndarray],
                  kernels: Any) -> Row:
    row = new_row("ray", w, f"ray.init(num_cpus=2), {RAY_BLOCKS ** 2} coarse tasks, "
                            "inputs in the object store")
    row.details[0]["blas"] = kernels
    v = make_inputs(w)
    run: Callable[[], list[Any]]
    if w.kind == "matmul":
        s = -(-w.n // RAY_BLOCKS)
        a_rows = [ray.put(v["a"][i * s:(i + 1) * s]) for i in range(RAY_BLOCKS)]
        b_cols = [ray.put(np.ascontiguousarray(v["b"][:, j * s:(j + 1) * s])) for j in range(RAY_BLOCKS)]

        def run() -> list[Any]:
            blocks = [mm.remote(a, b) for a in a_rows for b in b_cols]
            ray.wait(blocks, num_returns=len(blocks), fetch_local=False)
            return [blocks]

        def read(blocks: Any, idx: tuple[slice, ...]) -> np.ndarray:
            # the probes sit in the first and the last output block
            return ray.get(blocks[0 if idx[0] == _FIRST else -1])[idx]
    else:
        s = -(-w.n // RAY_BLOCKS**2)
        x_rows = [ray.put(v["x"][i * s:(i + 1) * s]) for i in range(RAY_BLOCKS**2) if i * s < w.n]

        def run() -> list[Any]:
            return [np.float32(np.sum(ray.get([chain.remote(x) for x in x_rows])))]

        read = _index
    verify(row, w, probes(w, run(), read), ref)
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        record(row, w, time.perf_counter() - start)
    return row


# --- triplane ----------------------------------------------------------------------------


def tile_shape(plan: dict[str, Any]) -> tuple[int, int] | None:
    """The tile shape of the most-split 2-D tensor of an explain document, if it is split."""
    best: tuple[int, tuple[int, int]] | None = None
    for t in plan.get("tensors") or []:
        tiles = t.get("tiles") or [] if isinstance(t, dict) else []
        if len(tiles) < 2 or not isinstance(tiles[0], dict):
            continue
        ty = tiles[0].get("type")
        if isinstance(ty, dict):
            dims = ty.get("shape")
        else:  # "float32[1024,1024]"
            dims = [int(d) for d in re.findall(r"\d+", str(ty).split("[", 1)[-1])]
        if isinstance(dims, list) and len(dims) == 2 and (best is None or len(tiles) > best[0]):
            best = (len(tiles), (int(dims[0]), int(dims[1])))
    return best[1] if best else None


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

    def close(self) -> None:
        for c in (self.session, self.api):
            with suppress(Exception):
                if c is not None:
                    c.close()
        self.cluster.stop()
        self.cluster.run.clear_cluster()
        if os.environ.get("BENCH_KEEP_HOME") != "1":
            shutil.rmtree(self.home, ignore_errors=True)

    def prepare(self, outputs: Sequence[Any]) -> tuple[dict[str, Any], list[str]]:
        """The canonical graph document with every host input uploaded; output node ids."""
        from triplane.scheduler.compiler.pipeline import canonicalize
        from triplane.sdk.tensor import build_graph

        graph, _, bindings = build_graph(list(outputs))
        cgraph, rename, args = canonicalize(graph)
        doc = json.loads(cgraph.to_json())
        for node in doc["nodes"].values():
            if node["op"] == "input":  # attrs.tensor is "arg<i>" after canonicalize
                arg = int(node["attrs"]["tensor"][3:])
                node["attrs"]["tensor"] = self.session.upload(bindings[args[arg]])
        return doc, [rename[o._id] for o in outputs]

    def run(self, doc: dict[str, Any], fetch: list[str]) -> tuple[str, list[np.ndarray]]:
        job = self.session.submit(doc, fetch)
        self.session.wait(job)
        return job, [self.session.fetch(job, f) for f in fetch]

    def plan(self, job: str) -> dict[str, Any] | None:
        r = self.api.get(f"/v1/jobs/{job}/plan")
        return r.json() if r.status_code == 200 else None

    def release(self, job: str) -> None:
        with suppress(Exception):
            self.api.delete(f"/v1/jobs/{job}")


def bench_triplane(tp_: Triplane, w: Workload, repeats: int,
                   ref: dict[str, np.ndarray]) -> tuple[Row, tuple[int, int] | None]:
    """One workload on the cluster; the row and the tile shape its plan used (if split)."""
    import triplane as tp

    row = new_row("triplane", w, f"{len(tp_.cluster.executors)} executors ({tp_.blas[0]}), inputs "
                                 "uploaded before timing, submit -> done, scalars fetched")
    start = time.perf_counter()
    outs = triplane_outputs(w, {k: tp.tensor(a) for k, a in make_inputs(w).items()})
    doc, ids = tp_.prepare(outs)
    row.details[0].update(upload_s=time.perf_counter() - start, executors_blas=tp_.blas)
    scalars = [i for i, o in zip(ids, outs) if o.shape == ()]
    job, vals = tp_.run(doc, ids)  # warm-up: compiles, and fetches everything to check it
    tp_.release(job)
    verify(row, w, probes(w, vals), ref)
    tiles = None
    for _ in range(repeats):
        start = time.perf_counter()
        job, _vals = tp_.run(doc, scalars)
        seconds = time.perf_counter() - start
        plan = tp_.plan(job)
        ms = (plan or {}).get("makespan") or {}
        tiles = tile_shape(plan) if plan else None
        record(row, w, seconds, job=job, predicted_s=ms.get("predicted_s"), plan_actual_s=ms.get("actual_s"))
        tp_.release(job)
    row.details[0]["tile"] = list(tiles) if tiles else None
    return row, tiles


# --- report ------------------------------------------------------------------------------


def _by_workload(rows: list[Row], w: Workload) -> list[Row]:
    return [r for r in rows if r.details and r.details[0].get("workload") == w.key]


def _ok(rows: list[Row], name: str) -> Row | None:
    return next((r for r in rows if r.name == name and r.ok), None)


def table(ws: list[Workload], rows: list[Row]) -> str:
    headers = ["workload", "system", "best s", "median s", "best rate", "median rate", "x numpy"]
    cells = []
    for w in ws:
        group = _by_workload(rows, w)
        ref = _ok(group, NAMES["numpy"])
        for r in group:
            if not r.ok:
                cells.append([w.key, r.name, r.status[:70], "", "", "", ""])
                continue
            t = run_times(r)
            ratio = r.best_rate / ref.best_rate if ref and ref.best_rate and r.best_rate else None
            cells.append([w.key, r.name, fmt(min(t), 3), fmt(sorted(t)[len(t) // 2], 3),
                          fmt(r.best_rate, 1, f" {w.unit}"), fmt(r.median_rate, 1, f" {w.unit}"),
                          fmt(ratio, 2, "x")])
    return markdown_table(headers, cells, [False, False, *([True] * 5)])


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
        tile = r.details[0].get("tile")
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
            out.append(f"* {w.key}: triplane {x:.2f}x numpy's throughput (target >= 0.90), "
                       f"{'ahead of' if ahead else 'NOT ahead of'} {names} -- {'met' if met else 'NOT met'}")
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
        f"float32; {args.repeats} timed runs per system after a warm-up whose results were checked "
        "against float64 on sampled blocks; rates are GFLOP/s (matmul, mlp) or GB/s read (chain); "
        "x numpy compares best rates.", "",
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
    p.add_argument("--repeats", type=int, default=3, help="timed runs per system (default 3)")
    p.add_argument("--matmul", default="4096,8192", help="matmul sides (default 4096,8192; '' none)")
    p.add_argument("--chain", default="8192", help="elementwise chain sides (default 8192; '' none)")
    p.add_argument("--mlp", default="4096x2048", help="MLP step BATCHxWIDTH, comma-separated ('' none)")
    p.add_argument("--executors", type=int, default=2, help="triplane executors (default 2)")
    p.add_argument("--memory", default="6GiB", help="tile memory per executor (default 6GiB)")
    p.add_argument("--numpy-threads", type=int, default=2, help="BLAS threads of the numpy row")
    p.add_argument("--job-timeout", type=float, default=300.0, help="seconds one triplane job may take")
    p.add_argument("--keep-blas-env", dest="unpin", action="store_false",
                   help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the child processes (tests, CI)")
    p.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="compute", help="result file stem (default compute)")
    p.add_argument("--numpy-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
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
    args.workloads = ws
    return args


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwind through every `finally`, which stops what we started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.numpy_child:
        print(json.dumps(numpy_child(json.loads(args.numpy_child))))
        return 0
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    pins = {k: os.environ[k] for k in OPENBLAS_PIN_VARS if k in os.environ}
    if args.unpin:  # only processes started from now on see it; this one computes no timings
        for k in OPENBLAS_PIN_VARS:
            os.environ.pop(k, None)
    ws: list[Workload] = args.workloads
    print("float64 references ...", file=sys.stderr, flush=True)
    refs = {w.key: reference(w, make_inputs(w)) for w in ws}
    rows: list[Row] = []
    chunks: dict[str, tuple[int, int]] = {}
    code = 0
    if "triplane" in args.systems:
        print("measuring triplane ...", file=sys.stderr, flush=True)
        try:
            cluster = Triplane(args.executors, args.memory, args.job_timeout)
        except ClusterStartError as e:
            print(f"error: the triplane cluster could not start: {e}", file=sys.stderr)
            return 2
        try:
            for w in ws:
                try:
                    row, tile = bench_triplane(cluster, w, args.repeats, refs[w.key])
                except Exception as e:  # one workload failing must not lose the others
                    row, tile = new_row("triplane", w, status=f"failed: {type(e).__name__}: {e}"[:300]), None
                    print(f"triplane {w.key} failed: {e}", file=sys.stderr)
                rows.append(row)
                if tile:
                    chunks[w.key] = tile
        finally:
            cluster.close()
    for s in ("numpy", "dask", "ray"):
        if s not in args.systems:
            continue
        print(f"measuring {NAMES[s]} ...", file=sys.stderr, flush=True)
        try:
            if s == "numpy":
                rows += bench_numpy(ws, args.repeats, args.numpy_threads, args.unpin, refs, timeout=900)
            elif s == "dask":
                rows += bench_dask(ws, args.repeats, refs, chunks)
            else:
                rows += bench_ray(ws, args.repeats, refs)
        except Exception as e:  # a failing baseline must not lose the others' numbers
            rows += [new_row(s, w, status=f"failed: {type(e).__name__}: {e}"[:300]) for w in ws]
            print(f"{NAMES[s]} failed: {e}", file=sys.stderr)
    if any(r.status.startswith("wrong result") for r in rows) or \
            any(r.name == NAMES["triplane"] and not r.ok for r in rows):
        code = 1
    facts = machine_facts(["numpy", "httpx", "fastapi", "uvicorn", "uvloop", "dask", "distributed", "ray",
                           "threadpoolctl"])
    facts["openblas_pins"] = pins
    text = report(ws, rows, args, facts)
    print(text)
    payload = {"benchmark": "compute", "repeats": args.repeats, "executors": args.executors,
               "numpy_threads": args.numpy_threads, "unpinned": args.unpin,
               "workloads": [{**asdict(w), "key": w.key, "unit": w.unit, "work": w.work} for w in ws],
               "machine": facts, "rows": [{**r.summary(), "seconds": run_times(r)} for r in rows]}
    jpath, mpath = write_results(args.name, payload, text, args.results_dir)
    print(f"\nwrote {jpath} and {mpath}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
