"""The baselines of bench/compute.py -- numpy (a persistent child process), Dask
distributed and Ray -- and the row helpers they share with it.

Every system implements :class:`System`: ``prepare`` a workload (inputs placed, a warm-up
run checked against float64), ``run`` it once timed, ``release`` its data, ``close``.
bench/compute.py starts them all, interleaves their timed runs in rounds and reports.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
from _common import (
    Row,
    blas_env,
    blas_info,
)
from compute_workloads import (
    _FIRST,
    Workload,
    _index,
    check,
    compute,
    make_inputs,
    probes,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "compute.py"  # the numpy child runs `compute.py --numpy-child`
SYSTEMS = ("triplane", "numpy", "dask", "ray")  # also the order of preparation
NAMES = {"triplane": "triplane", "numpy": "numpy", "dask": "Dask distributed", "ray": "Ray"}
RAY_BLOCKS = 4  # per side: 16 coarse tasks
Refs = dict[str, np.ndarray]



def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def new_row(system: str, w: Workload, notes: str = "", status: str = "ok") -> Row:
    row = Row(NAMES[system], notes=notes, status=status)
    row.details.append({"workload": w.key})  # details[0] describes the row; runs follow
    return row


def failed(e: BaseException) -> str:
    return f"failed: {type(e).__name__}: {e}"[:300]


def record(row: Row, w: Workload, seconds: float, **extra: Any) -> None:
    row.rates.append(w.work / seconds / 1e9)
    row.details.append({"seconds": seconds, **extra})


def verify(row: Row, w: Workload, got: dict[str, np.ndarray], ref: Refs) -> None:
    problem = check(w, got, ref)
    if problem is not None:
        row.status = f"wrong result: {problem}"


def run_times(row: Row) -> list[float]:
    return [d["seconds"] for d in row.details if "seconds" in d]


class System(Protocol):
    """One measured system, started before any workload and closed once at the end.

    ``prepare`` places a workload's inputs, does the checked warm-up run and returns the
    row (status not ``ok``: the system sits this workload out); it raises when it fails.
    ``run`` does one timed run of the prepared workload: its seconds and what else it
    measured. ``release`` drops the workload's data (also after a failed prepare)."""

    key: str

    def prepare(self, w: Workload, ref: Refs, tile: tuple[int, int] | None) -> Row: ...

    def run(self) -> tuple[float, dict[str, Any]]: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


# --- numpy (a persistent child process with its own BLAS threads) ------------------------


def serve_numpy(inp: TextIO, out: TextIO) -> None:
    """The numpy child: one JSON answer line per request line, until ``inp`` closes.

    ``{"cmd": "prepare", "workload": {...}}`` makes the inputs and does the warm-up run ->
    ``{"probes": {...}, "blas": [...]}``; ``{"cmd": "run"}`` -> ``{"seconds": s}`` (one
    timed run); ``{"cmd": "release"}`` drops the inputs -> ``{"released": true}``. A failing
    request is answered ``{"error": "..."}`` and the child serves on."""
    w: Workload | None = None
    v: dict[str, np.ndarray] | None = None
    for line in iter(inp.readline, ""):
        answer: dict[str, Any]
        try:
            req = json.loads(line)
            cmd = req.get("cmd") if isinstance(req, dict) else None
            if cmd == "prepare":
                w, v = None, None  # the previous workload's arrays go before the new ones come
                w = Workload(**req["workload"])
                v = make_inputs(w)
                got = probes(w, compute(w, v, np))
                answer = {"probes": {k: a.tolist() for k, a in got.items()}, "blas": blas_info()}
            elif cmd == "run":
                if w is None or v is None:
                    raise RuntimeError("'run' before 'prepare'")
                start = time.perf_counter()
                compute(w, v, np)
                answer = {"seconds": time.perf_counter() - start}
            elif cmd == "release":
                w, v = None, None
                answer = {"released": True}
            else:
                raise ValueError(f"unknown command {cmd!r} (known: prepare, run, release)")
        except Exception as e:
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def numpy_child_main() -> int:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (Python or C) go to stderr, never into the answers
    sys.stdout = sys.stderr
    serve_numpy(sys.stdin, out)
    return 0


class NumpyChildError(RuntimeError):
    """The numpy child exited, overran its time or answered something unexpected."""


class NumpyChild:
    """The parent's end of :func:`serve_numpy`: every answer is awaited at most ``timeout``
    seconds. A child that exits, overruns or answers garbage is killed and the request
    raises :class:`NumpyChildError`; an ``{"error"}`` answer raises it too (the child lives)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None, timeout: float) -> None:
        self.timeout = timeout
        # stderr to a file (closed in close()): a full stderr pipe would block the child
        self._err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, text=True, cwd=REPO, env=env)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: TextIO) -> None:
        with suppress(ValueError, OSError):
            for line in stream:
                self._lines.put(line)
        self._lines.put(None)

    def ask(self, cmd: str, expect: Sequence[str] = (), **fields: Any) -> dict[str, Any]:
        """Send one request; its answer, which must hold the keys ``expect``."""
        if self.proc.poll() is not None:
            raise NumpyChildError(self._gone(cmd))
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self._lines.get(timeout=self.timeout)
        except OSError:
            line = None
        except queue.Empty:
            self.close(kill=True)
            raise NumpyChildError(f"the numpy child gave no answer to {cmd!r} within "
                                  f"{self.timeout:g} s (killed)") from None
        if line is None:
            raise NumpyChildError(self._gone(cmd))
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            raise NumpyChildError(f"the numpy child failed {cmd!r}: {answer['error']}")
        if not isinstance(answer, dict) or any(k not in answer for k in expect):
            self.close(kill=True)
            raise NumpyChildError(f"the numpy child answered {cmd!r} with {line.strip()[:200]!r}, "
                                  f"not a JSON object with {', '.join(expect) or 'any keys'} (killed)")
        return answer

    def _gone(self, cmd: str) -> str:
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        tail = ""
        with suppress(ValueError, OSError):
            self._err.seek(0)
            tail = self._err.read().strip()[-800:]
        self.close(kill=True)
        return (f"the numpy child exited (code {self.proc.returncode}) before answering {cmd!r}"
                + (f": {tail}" if tail else ""))

    def close(self, kill: bool = False) -> None:
        """Close its stdin (it exits); kill it at once with ``kill``, else if it has not
        exited after 5 s."""
        with suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=0 if kill else 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


class NumpyBaseline:
    key = "numpy"

    def __init__(self, threads: int, unpin: bool, timeout: float, argv: Sequence[str] | None = None) -> None:
        argv = argv or [sys.executable, str(SCRIPT), "--numpy-child"]
        self.child = NumpyChild(argv, blas_env(threads, unpin=unpin), timeout)

    def prepare(self, w: Workload, ref: Refs, tile: tuple[int, int] | None) -> Row:
        a = self.child.ask("prepare", ("probes", "blas"), workload=asdict(w))
        blas = a["blas"] if isinstance(a["blas"], list) else []
        kernel = ", ".join(f"{b.get('internal_api')} {b.get('architecture')} x{b.get('num_threads')}"
                           for b in blas if isinstance(b, dict))
        row = new_row("numpy", w, f"1 process, {kernel or 'BLAS unknown'}")
        row.details[0]["blas"] = blas
        try:
            got = {k: np.asarray(p, dtype=np.float64) for k, p in dict(a["probes"]).items()}
        except (TypeError, ValueError) as e:
            raise NumpyChildError(f"the numpy child's probes are not numbers: {e}") from None
        verify(row, w, got, ref)
        return row

    def run(self) -> tuple[float, dict[str, Any]]:
        seconds = self.child.ask("run", ("seconds",))["seconds"]
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
            self.child.close(kill=True)
            raise NumpyChildError(f"the numpy child answered 'run' with seconds={seconds!r} (killed)")
        return float(seconds), {}

    def release(self) -> None:
        if self.child.proc.poll() is None:
            self.child.ask("release")

    def close(self) -> None:
        self.child.close()


# --- Dask ------------------------------------------------------------------------------


def _same(block: np.ndarray) -> np.ndarray:
    return block


class DaskBaseline:
    """``distributed.LocalCluster`` of 2 workers x 1 thread and a Client to it."""

    key = "dask"

    def __init__(self) -> None:
        import warnings

        from distributed import Client, LocalCluster

        # The inputs travel once, from this process, before timing: that is the point here.
        warnings.filterwarnings("ignore", message="Sending large graph")
        # The nanny gives each worker 1 BLAS thread (distributed.nanny.pre-spawn-environ).
        self.cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                    dashboard_address=None, silence_logs=logging.ERROR)
        try:
            self.client = Client(self.cluster)
            self.kernels = list(self.client.run(blas_info).values())
        except BaseException:
            self.cluster.close()
            raise
        self.v: dict[str, Any] = {}
        self.w: Workload | None = None
        self.tag = 0

    def prepare(self, w: Workload, ref: Refs, tile: tuple[int, int] | None) -> Row:
        import dask.array as da
        from distributed import wait

        ch = tile or w.default_chunks()
        row = new_row("dask", w, f"LocalCluster(2 workers x 1 thread), chunks {ch[0]}x{ch[1]}, "
                                 "inputs persisted")
        row.details[0].update(chunks=list(ch), blas=self.kernels)
        self.w = w
        self.v = {k: self.client.persist(da.from_array(a, chunks=ch)) for k, a in make_inputs(w).items()}
        wait(list(self.v.values()))
        verify(row, w, probes(w, self._outputs(), lambda o, idx: o[idx].compute()), ref)
        return row

    def _outputs(self) -> list[Any]:
        import dask.array as da
        from distributed import wait

        assert self.w is not None
        # Dask names results by a hash of their graph, and a persist whose keys are still in
        # memory (the previous run's) returns at once without computing. A per-run identity
        # over each input (no copy) makes every key new, so every run computes.
        self.tag += 1
        fresh = {k: a.map_blocks(_same, dtype=a.dtype, name=f"{k}-run{self.tag}") for k, a in self.v.items()}
        outs = self.client.persist(compute(self.w, fresh, da))
        wait(outs)
        return outs

    def run(self) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        self._outputs()
        return time.perf_counter() - start, {}

    def release(self) -> None:
        self.v, self.w = {}, None  # the persisted collections go with their last reference

    def close(self) -> None:
        with suppress(Exception):
            self.client.close()
        self.cluster.close()


# --- Ray -------------------------------------------------------------------------------


def _ray_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


def _ray_chain(x: np.ndarray) -> np.float32:
    return np.exp(x * 2 + 1).sum()


class RayBaseline:
    """``ray.init(num_cpus=2)`` with hand-written coarse tasks; ``close`` shuts Ray down."""

    key = "ray"

    def __init__(self, ws: Sequence[Workload]) -> None:
        import ray

        self.ray = ray
        biggest = max((4 * w.n * max(w.n, w.width) for w in ws), default=0)
        ours = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                     object_store_memory=int(min(6 << 30, max(256 << 20, 6 * biggest))),
                     # 1 BLAS thread per task; bench/ on the path so workers can import _common
                     runtime_env={"env_vars": {**{k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                                   "MKL_NUM_THREADS")},
                                               "PYTHONPATH": os.pathsep.join([str(REPO / "bench"),
                                                                              str(REPO)])}})
            if callable(ours):  # ray.init's SIGTERM handler dies on the spot; ours unwinds (shutdown)
                signal.signal(signal.SIGTERM, ours)
            self.mm, self.chain = ray.remote(_ray_matmul), ray.remote(_ray_chain)
            self.kernels = ray.get(ray.remote(blas_info).remote())
        except BaseException:
            ray.shutdown()
            raise
        self._run: Callable[[], Any] | None = None

    def prepare(self, w: Workload, ref: Refs, tile: tuple[int, int] | None) -> Row:
        if w.kind == "mlp":
            return new_row("ray", w, status="n/a (no hand-written MLP step)")
        ray = self.ray
        row = new_row("ray", w, f"ray.init(num_cpus=2), {RAY_BLOCKS ** 2} coarse tasks, "
                                "inputs in the object store")
        row.details[0]["blas"] = self.kernels
        v = make_inputs(w)
        read: Callable[[Any, tuple[slice, ...]], Any]
        if w.kind == "matmul":
            s = -(-w.n // RAY_BLOCKS)
            a_rows = [ray.put(v["a"][i * s:(i + 1) * s]) for i in range(RAY_BLOCKS)]
            b_cols = [ray.put(np.ascontiguousarray(v["b"][:, j * s:(j + 1) * s])) for j in range(RAY_BLOCKS)]

            def run() -> list[Any]:
                blocks = [self.mm.remote(a, b) for a in a_rows for b in b_cols]
                ray.wait(blocks, num_returns=len(blocks), fetch_local=False)
                return [blocks]

            def read(blocks: Any, idx: tuple[slice, ...]) -> np.ndarray:
                # the probes sit in the first and the last output block
                return ray.get(blocks[0 if idx[0] == _FIRST else -1])[idx]
        else:
            s = -(-w.n // RAY_BLOCKS**2)
            x_rows = [ray.put(v["x"][i * s:(i + 1) * s]) for i in range(RAY_BLOCKS**2) if i * s < w.n]

            def run() -> list[Any]:
                return [np.float32(np.sum(ray.get([self.chain.remote(x) for x in x_rows])))]

            read = _index
        self._run = run  # holds the input refs until release
        verify(row, w, probes(w, run(), read), ref)
        return row

    def run(self) -> tuple[float, dict[str, Any]]:
        assert self._run is not None
        start = time.perf_counter()
        self._run()
        return time.perf_counter() - start, {}

    def release(self) -> None:
        self._run = None  # the last references to the inputs in the object store

    def close(self) -> None:
        self.ray.shutdown()
