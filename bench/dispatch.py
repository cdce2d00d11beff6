"""Dispatch throughput and per-task round trip: triplane against Dask, Ray and bare UDP.

    python bench/dispatch.py [--tasks 10000] [--chain 500] [--repeats 3]
                             [--systems triplane,dask,ray,udp,codec]

Every system runs the same two workloads on this machine, in this run:

* **throughput**: ``--tasks`` independent no-op tasks submitted at once; tasks/s is
  tasks / (submit -> all done).
* **round trip**: a chain of ``--chain`` tasks, each depending on the one before, submitted
  at once; the per-task round trip is total / chain: one task's full trip from "ready" to
  "its successor may start" (dispatch, execute, reply, bookkeeping).

Rows (docs in bench/README.md):

* ``triplane``: a local cluster of ``--executors`` executors (``python -m triplane up``
  in a temporary run directory), jobs submitted through the REST API (httpx). The
  throughput job is ``--tasks`` 0-d ``full`` nodes with distinct values, every one a graph
  output and none fetched: sources survive constant folding (it folds only nodes with
  inputs), distinct values survive CSE, outputs survive DCE, so each node is one task,
  and nothing but dispatch is measured. The values differ per run, so every run pays
  validation and compilation too (no plan-cache hit). The chain is a 0-d ``normal``
  (random: never folded) followed by ``neg`` nodes, every one an output (so fusion leaves
  them separate tasks). A job of at most 256 tasks whose tensors total at most 4 MiB runs
  as one grouped task (docs/runtime.md, "Grouped jobs"): ``--tasks`` and ``--chain`` above
  256 (the defaults, 10000 and 500) measure one task per node; smaller ones measure one
  grouped task, which is not per-task dispatch.
* ``dask``: ``distributed.LocalCluster`` with 2 single-threaded worker processes;
  ``client.map`` of a no-op / a chain of ``client.submit``.
* ``ray``: ``ray.init(num_cpus=2)``; no-op ``@ray.remote`` tasks / a chain of them.
* ``bare UDP``: the floor. One datagram to an echo process and back, one at a time.
* ``codec + asyncio UDP``: the same, but the request is a signed task packet that the
  echo process decodes (``decode_task``) and answers with a signed reply, both ends on
  asyncio -- what any packet-based dispatcher pays per task at least.

Each system is measured ``--repeats`` times; the table shows the best and the median.
Results go to bench/results/dispatch.{json,md} (``--results-dir`` to change). The script
cleans up every process it started, also on Ctrl-C / SIGTERM, and exits with 2 and a
message if the triplane cluster cannot start (1 if triplane fails later).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python bench/dispatch.py` from anywhere
from _common import Row, fmt, machine_facts, markdown_table, timed, write_results

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("triplane", "dask", "ray", "udp", "codec")
NAMES = {"triplane": "triplane", "dask": "Dask distributed", "ray": "Ray",
         "udp": "bare UDP (floor)", "codec": "codec + asyncio UDP"}
SECRET = b"bench-secret-not-for-production"
TRIPLANE_CMD = [sys.executable, "-m", "triplane"]  # the launcher CLI (tests substitute a failing one)


class ClusterStartError(RuntimeError):
    """The triplane cluster did not come up (the message says why, with its log tail)."""


# --- the UDP floor -------------------------------------------------------------------------

# The echo process: prints its port, answers every datagram, exits when stdin closes (so
# it cannot outlive the benchmark even if this process is SIGKILLed).
ECHO = r"""
import os, socket, sys, threading
def _watch():
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=_watch, daemon=True).start()
mode, secret = sys.argv[1], sys.argv[2].encode()
if mode == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1], flush=True)
    while True:
        data, addr = s.recvfrom(65536)
        s.sendto(data, addr)
else:
    import asyncio, time
    from triplane.proto import packet as pk
    class Echo(asyncio.DatagramProtocol):
        def connection_made(self, transport):
            self.t = transport
            print(transport.get_extra_info("sockname")[1], flush=True)
        def datagram_received(self, data, addr):
            p = pk.decode_task(data, secret)
            now = time.time()
            out = tuple(pk.TileInfo(o, (), "float32", 4) for o in p.outputs)
            self.t.sendto(pk.encode_reply(pk.Reply(p.task, True, pk.Timings(now, now, now), out),
                                          secret), addr)
    async def main():
        await asyncio.get_running_loop().create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
        await asyncio.Event().wait()
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
"""


def _env(**extra: str) -> dict[str, str]:
    """Our environment, with the repository importable (children run from a checkout too)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


@contextmanager
def echo_process(mode: str) -> Iterator[int]:
    """Start the echo process in ``mode`` (``udp`` or ``codec``); yield its UDP port."""
    env = _env()
    proc = subprocess.Popen([sys.executable, "-c", ECHO, mode, SECRET.decode()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = _readline(proc, timeout=20.0)
        yield int(line)
    finally:
        stop_process(proc)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise RuntimeError(f"echo process gave no port within {timeout:.0f} s")
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        raise RuntimeError(f"echo process failed to start (exit code {proc.poll()})")
    return line


def stop_process(proc: subprocess.Popen[Any], grace: float = 3.0) -> None:
    """Close its stdin, then SIGTERM, then SIGKILL: whatever it takes, within ``2 * grace`` s."""
    with suppress(OSError):
        if proc.stdin:
            proc.stdin.close()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with suppress(ProcessLookupError):
            proc.send_signal(sig)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(grace)


def bench_udp(n: int, repeats: int) -> Row:
    row = Row(NAMES["udp"], notes="serial ping-pong of a 300-byte datagram; tasks/s = 1 / round trip")
    payload = b"x" * 300
    with echo_process("udp") as port, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("127.0.0.1", port))
        s.settimeout(5.0)

        def pingpong(k: int) -> None:
            for _ in range(k):
                s.send(payload)
                s.recv(65536)

        pingpong(200)  # warm up
        for _ in range(repeats):
            dt = timed(lambda: pingpong(n))
            row.rates.append(n / dt)
            row.roundtrips_us.append(dt / n * 1e6)
    return row


def bench_codec(n: int, repeats: int) -> Row:
    row = Row(NAMES["codec"], notes="signed task packet -> decode -> signed reply -> decode, "
                                    "asyncio on both ends, serial")
    with echo_process("codec") as port:
        try:  # uvloop where available, as the scheduler and executors use it
            import uvloop
        except ImportError:
            asyncio.run(_codec_client(port, n, repeats, row))
        else:
            uvloop.run(_codec_client(port, n, repeats, row))
            row.notes += " (uvloop)"
    return row


async def _codec_client(port: int, n: int, repeats: int, row: Row) -> None:
    from triplane.proto import packet as pk

    loop = asyncio.get_running_loop()
    waiter: list[asyncio.Future[bytes]] = []

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            if waiter and not waiter[0].done():
                waiter[0].set_result(data)

    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
    try:
        async def run(k: int, tag: str) -> None:
            deadline = time.time() + 600
            for i in range(k):
                packet = pk.TaskPacket(task=f"j{tag}.n{i}.a0", op="full", inputs=(),
                                       outputs=(f"j{tag}.n{i}",), deadline=deadline,
                                       attrs={"value": float(i), "shape": [], "dtype": "float32"},
                                       to="echo", t=time.time())
                waiter[:] = [loop.create_future()]
                transport.sendto(pk.encode_task(packet, SECRET))
                reply = pk.decode_reply(await asyncio.wait_for(waiter[0], 5.0), SECRET)
                if not reply.ok:
                    raise RuntimeError(f"echo answered {reply}")

        await run(200, "warm")
        for r in range(repeats):
            start = time.perf_counter()
            await run(n, f"run{r}")
            dt = time.perf_counter() - start
            row.rates.append(n / dt)
            row.roundtrips_us.append(dt / n * 1e6)
    finally:
        transport.close()


# --- Dask and Ray ---------------------------------------------------------------------------


def noop(x: Any = None) -> Any:
    return x


def bench_dask(n: int, chain: int, repeats: int) -> Row:
    row = Row(NAMES["dask"], notes="LocalCluster(n_workers=2, threads_per_worker=1), client.map")
    try:
        import logging

        from distributed import Client, LocalCluster, wait
    except ImportError:
        row.status = "not installed (pip install 'dask[distributed]')"
        return row
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        wait(client.map(noop, range(200), pure=False))  # warm up: workers connected, code shipped
        for _ in range(repeats):
            start = time.perf_counter()
            futures = client.map(noop, range(n), pure=False)
            wait(futures)
            row.rates.append(n / (time.perf_counter() - start))
            del futures

            start = time.perf_counter()
            f = client.submit(noop, 0, pure=False)
            for _ in range(chain - 1):
                f = client.submit(noop, f, pure=False)
            f.result()
            row.roundtrips_us.append((time.perf_counter() - start) / chain * 1e6)
            del f
    return row


def bench_ray(n: int, chain: int, repeats: int) -> Row:
    row = Row(NAMES["ray"], notes="ray.init(num_cpus=2), no-op @ray.remote tasks")
    try:
        import ray
    except ImportError:
        row.status = "not installed (pip install ray)"
        return row
    import logging

    ours = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             object_store_memory=200 * 1024 * 1024)
    # ray.init installs a native SIGTERM handler that dies on the spot; ours unwinds through
    # `finally` (ray.shutdown) instead.
    if callable(ours):
        signal.signal(signal.SIGTERM, ours)
    try:
        remote_noop = ray.remote(noop)
        ray.get([remote_noop.remote(i) for i in range(200)])  # warm up: worker processes started
        for _ in range(repeats):
            start = time.perf_counter()
            ray.get([remote_noop.remote(i) for i in range(n)])
            row.rates.append(n / (time.perf_counter() - start))

            start = time.perf_counter()
            ref = remote_noop.remote(0)
            for _ in range(chain - 1):
                ref = remote_noop.remote(ref)
            ray.get(ref)
            row.roundtrips_us.append((time.perf_counter() - start) / chain * 1e6)
    finally:
        ray.shutdown()
    return row


# --- triplane -------------------------------------------------------------------------------


def noop_graph(n: int, salt: int) -> dict[str, Any]:
    """``n`` independent 0-d ``full`` tasks, every one an output (see the module docstring)."""
    nodes = {f"f{i}": {"op": "full", "shape": [], "dtype": "float32",
                       "attrs": {"value": float(salt * n + i), "shape": [], "dtype": "float32"}}
             for i in range(n)}
    return {"version": 1, "nodes": nodes, "outputs": list(nodes)}


def chain_graph(n: int, salt: int) -> dict[str, Any]:
    """A ``normal`` source then ``n - 1`` dependent ``neg`` tasks, every one an output."""
    nodes: dict[str, Any] = {"c0": {"op": "normal", "shape": [], "dtype": "float32",
                                    "attrs": {"seed": salt, "shape": [], "dtype": "float32"}}}
    for i in range(1, n):
        nodes[f"c{i}"] = {"op": "neg", "inputs": [f"c{i - 1}"], "shape": [], "dtype": "float32"}
    return {"version": 1, "nodes": nodes, "outputs": list(nodes)}


def _pids(info: Any) -> set[int]:
    """Every pid recorded in cluster.json, wherever the launcher put it."""
    found: set[int] = set()
    if isinstance(info, dict):
        for k, v in info.items():
            if k in ("pid", "pids"):
                vals = v.values() if isinstance(v, dict) else v if isinstance(v, list) else [v]
                found.update(p for p in vals if isinstance(p, int) and p > 1)
            found |= _pids(v)
    elif isinstance(info, list):
        for v in info:
            found |= _pids(v)
    return found


def _log_tail(home: Path, lines: int = 15) -> str:
    out = []
    for log in sorted((home / "logs").glob("*.log")) if (home / "logs").is_dir() else []:
        text = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {log.name} ---\n" + "\n".join(text))
    return "\n".join(out)


def _pids_of_home(home: Path) -> set[int]:
    """Live processes whose command line names ``home``: only the cluster started in this
    (fresh, uniquely named) run directory can, e.g. through ``--token-file <home>/token``."""
    found, marker = set(), str(home).encode()
    for entry in Path("/proc").glob("[0-9]*"):
        with suppress(OSError, ValueError):
            if marker in (entry / "cmdline").read_bytes() and int(entry.name) != os.getpid():
                found.add(int(entry.name))
    return found


def _up(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``triplane up``. Interrupted (timeout, Ctrl-C, SIGTERM), it gets SIGINT so that
    it stops what it already started before it exits; SIGKILL only if it does not."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@contextmanager
def triplane_cluster(executors: int, timeout: float = 120.0) -> Iterator[tuple[str, str]]:
    """``triplane up`` in a fresh temporary run directory; yield (url, token). On the way
    out, whatever happened: ``triplane down``, then SIGKILL for any process still alive
    that cluster.json recorded or whose command line names the run directory."""
    home = Path(tempfile.mkdtemp(prefix="triplane-bench-"))
    env = _env(TRIPLANE_HOME=str(home))
    env.pop("TRIPLANE_URL", None)
    env.pop("TRIPLANE_TOKEN", None)
    try:
        try:
            up = _up([*TRIPLANE_CMD, "up", "--executors", str(executors)], env, timeout)
        except subprocess.TimeoutExpired:
            raise ClusterStartError(f"`triplane up` did not return within {timeout:.0f} s\n"
                                    f"{_log_tail(home)}") from None
        if up.returncode != 0:
            raise ClusterStartError(f"`triplane up --executors {executors}` exited {up.returncode}:\n"
                                    f"{(up.stderr or up.stdout).strip()[-2000:]}\n{_log_tail(home)}")
        try:
            info = json.loads((home / "cluster.json").read_text())
            url, token = info["url"], (home / "token").read_text().strip()
            # `triplane down` removes cluster.json; this copy lets a kept run dir (and the
            # smoke test) check afterwards that every recorded process is gone.
            (home / "bench-cluster.json").write_text(json.dumps(info))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ClusterStartError(f"`triplane up` left no usable cluster.json/token in {home}: "
                                    f"{e}") from None
        yield url, token
    finally:
        info = None
        with suppress(OSError, ValueError):
            info = json.loads((home / "cluster.json").read_text())
        with suppress(subprocess.SubprocessError, OSError):
            subprocess.run([*TRIPLANE_CMD, "down"], env=env, cwd=REPO, capture_output=True, timeout=30)
        for pid in _pids(info) | _pids_of_home(home):  # our own cluster's processes only
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if os.environ.get("BENCH_KEEP_HOME") != "1":
            import shutil

            shutil.rmtree(home, ignore_errors=True)


def run_job(client: Any, graph: dict[str, Any], timeout: float) -> dict[str, float]:
    """Submit ``graph`` (fetching nothing) and wait until it ends. Returns the seconds for
    ``submit`` (the POST: validate, store, compile) and ``total`` (submit -> done)."""
    body = json.dumps({"graph": graph, "fetch": []}, separators=(",", ":")).encode()
    start = time.perf_counter()
    r = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    submitted = time.perf_counter()
    if r.status_code != 201:
        raise RuntimeError(f"POST /v1/jobs answered {r.status_code}: {r.text[:500]}")
    job = r.json()["id"]
    end_by = start + timeout
    while True:
        left = end_by - time.perf_counter()
        if left <= 0:
            raise RuntimeError(f"job {job} did not finish within {timeout:.0f} s")
        r = client.get(f"/v1/jobs/{job}/wait", params={"timeout": min(left, 10.0)},
                       timeout=min(left, 10.0) + 10.0)
        if r.status_code != 200:
            raise RuntimeError(f"GET /v1/jobs/{job}/wait answered {r.status_code}: {r.text[:500]}")
        state = r.json()
        if state["state"] in ("done", "failed", "cancelled"):
            break
    total = time.perf_counter() - start
    if state["state"] != "done":
        raise RuntimeError(f"job {job} ended {state['state']}: {state.get('error')}")
    return {"submit": submitted - start, "total": total}


def bench_triplane(n: int, chain: int, repeats: int, executors: int) -> Row:
    import httpx

    row = Row(NAMES["triplane"], notes=f"{executors} executors (triplane up), REST submit -> done; "
                                       "0-d full nodes, all outputs, none fetched")
    with triplane_cluster(executors) as (url, token), \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60.0) as client:
        timeout = 60.0 + n / 100
        run_job(client, noop_graph(min(n, 200), salt=10**6), timeout)  # warm up
        for r in range(repeats):
            t = run_job(client, noop_graph(n, salt=r), timeout)
            c = run_job(client, chain_graph(chain, salt=r), 60.0 + chain / 50)
            row.rates.append(n / t["total"])
            row.roundtrips_us.append(c["total"] / chain * 1e6)
            row.details.append({"tasks": n, "submit_s": t["submit"], "total_s": t["total"],
                                "chain": chain, "chain_submit_s": c["submit"], "chain_total_s": c["total"]})
    return row


# --- report ---------------------------------------------------------------------------------


def table(rows: list[Row]) -> tuple[list[str], list[list[str]], list[bool]]:
    ray = next((r for r in rows if r.name == NAMES["ray"] and r.ok), None)
    dask = next((r for r in rows if r.name == NAMES["dask"] and r.ok), None)
    headers = ["system", "tasks/s best", "tasks/s median", "us/task (1/rate)", "round trip us best",
               "round trip us median", "x Ray", "x Dask"]
    out = []
    for r in rows:
        if not r.ok:
            out.append([r.name, r.status, "", "", "", "", "", ""])
            continue
        best = r.best_rate or 0.0
        out.append([r.name, fmt(best), fmt(r.median_rate), fmt(1e6 / best, 1) if best else "-",
                    fmt(r.best_roundtrip_us, 1), fmt(r.median_roundtrip_us, 1),
                    fmt(best / ray.best_rate, 2, "x") if ray and ray.best_rate else "-",
                    fmt(best / dask.best_rate, 2, "x") if dask and dask.best_rate else "-"])
    return headers, out, [False, *([True] * 7)]


def report(rows: list[Row], args: argparse.Namespace, facts: dict[str, Any]) -> str:
    headers, cells, right = table(rows)
    lines = [
        "# Dispatch benchmark (bench/dispatch.py)", "",
        f"{args.tasks:,} independent no-op tasks per run (throughput) and a chain of {args.chain:,} "
        f"dependent tasks (round trip = total / chain); {args.repeats} runs per system, "
        "ratios from the best rates.", "",
        markdown_table(headers, cells, right), "",
        "Machine: " + ", ".join(f"{k} {facts[k]}" for k in ("nproc", "cpu", "system", "python", "commit")
                                if facts.get(k) is not None),
        "Versions: " + ", ".join(f"{k} {v}" for k, v in facts["versions"].items() if v), "",
    ]
    lines += [f"* {r.name}: {r.notes}" for r in rows if r.notes]
    trip = next((r for r in rows if r.name == NAMES["triplane"] and r.ok), None)
    ray = next((r for r in rows if r.name == NAMES["ray"] and r.ok), None)
    if trip and ray and trip.best_rate and ray.best_rate:
        ratio = trip.best_rate / ray.best_rate
        lines += ["", f"Target (issue 3): triplane >= 3x Ray's rate in the same run: "
                      f"{ratio:.2f}x -- {'met' if ratio >= 3 else 'NOT met'}."]
    if trip and trip.details:
        d = min(trip.details, key=lambda x: x["total_s"])
        after = d["total_s"] - d["submit_s"]
        lines += ["", "triplane's best run: submit (POST: parse, validate, store, compile) "
                      f"{d['submit_s'] * 1e3:,.0f} ms of {d['total_s'] * 1e3:,.0f} ms total; "
                      f"from the 201 to done {d['tasks'] / after:,.0f} tasks/s"
                  + (f" ({d['tasks'] / after / ray.best_rate:.2f}x Ray)." if ray and ray.best_rate else ".")]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=10_000, help="independent tasks per run (default 10000)")
    p.add_argument("--chain", type=int, default=500,
                   help="dependent tasks in the round-trip chain (default 500)")
    p.add_argument("--repeats", type=int, default=3, help="runs per system (default 3)")
    p.add_argument("--executors", type=int, default=2, help="triplane executors (default 2)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)")
    p.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="dispatch", help="result file stem (default dispatch)")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown system(s) {sorted(unknown)} (known: {', '.join(SYSTEMS)})")
    if min(args.tasks, args.chain, args.repeats, args.executors) < 1:
        p.error("--tasks, --chain, --repeats and --executors must be >= 1")
    return args


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwind through every `finally`, which stops what we started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    order = [s for s in ("udp", "codec", "triplane", "dask", "ray") if s in args.systems]
    rows: list[Row] = []
    code = 0
    try:
        for s in order:
            print(f"measuring {NAMES[s]} ...", file=sys.stderr, flush=True)
            try:
                if s == "udp":
                    rows.append(bench_udp(args.tasks, args.repeats))
                elif s == "codec":
                    rows.append(bench_codec(args.tasks, args.repeats))
                elif s == "triplane":
                    rows.append(bench_triplane(args.tasks, args.chain, args.repeats, args.executors))
                elif s == "dask":
                    rows.append(bench_dask(args.tasks, args.chain, args.repeats))
                else:
                    rows.append(bench_ray(args.tasks, args.chain, args.repeats))
            except ClusterStartError as e:
                print(f"error: the triplane cluster could not start: {e}", file=sys.stderr)
                return 2
            except Exception as e:  # one system failing must not lose the others' numbers
                rows.append(Row(NAMES[s], status=f"failed: {type(e).__name__}: {e}"[:300]))
                print(f"{NAMES[s]} failed: {e}", file=sys.stderr)
                if s == "triplane":
                    code = 1
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        return 130
    facts = machine_facts(["numpy", "PyYAML", "orjson", "httpx", "fastapi", "uvicorn", "uvloop",
                           "dask", "distributed", "ray"])
    text = report(rows, args, facts)
    print(text)
    payload = {"benchmark": "dispatch", "tasks": args.tasks, "chain": args.chain, "repeats": args.repeats,
               "executors": args.executors, "machine": facts, "rows": [r.summary() for r in rows]}
    jpath, mpath = write_results(args.name, payload, text, args.results_dir)
    print(f"\nwrote {jpath} and {mpath}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
