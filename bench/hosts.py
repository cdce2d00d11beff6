"""Three executor hosts against one, on the network-namespace hosts of tests/multihost (issue 16).

    sudo python bench/hosts.py                 # both workloads, 1 and 3 executor hosts
    sudo python bench/hosts.py --quick         # one round, fewer steps

The cluster of tests/multihost/hostcluster.py (etcd and PostgreSQL on one host, a scheduler
on another, executors each on a host of their own, a client host; every host its own
network namespace on one bridge), once with one executor host and once with three:

* ``matmul 4096``: C = A @ B for two 4096 x 4096 float32 matrices made on the executors
  (tanh of a range: nothing is uploaded), the row sums of C fetched; checked against numpy.
* ``large MLP step``: bench/train.py's large model (MLP 1024-2048-2048-10, batch 512, Adam),
  the same code as its ``cluster`` row, through a session opened on the client host.

Per row: the best and median seconds, and the bytes each host's link moved during the
timed rounds (the kernel's counters of its veth, sent + received, per round), and the
executors' ``peer_bytes`` (tiles pulled from another executor, their own counter). All
hosts share this machine's CPUs: three executor hosts bring no more cores than one, so
the rows show what the network and placement cost and where the bytes go, not a speed-up.
Each executor runs one BLAS thread (as bench/train.py's cluster row).

Needs root (network namespaces), etcd and the PostgreSQL server; exit 2 (with the reason)
without them. Writes ``bench/results/hosts.json`` and ``hosts.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "multihost"))
import hostcluster  # noqa: E402
from _common import machine_facts, markdown_table, write_results  # noqa: E402

ONE_BLAS_THREAD = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
LAYOUTS = {1: ("exec-1",), 3: ("exec-1", "exec-2", "exec-3")}
WATCHED = ("sched-a", "exec-1", "exec-2", "exec-3", "client")


def matmul_round(c: hostcluster.MultiHost, n: int) -> None:
    import triplane as tp
    from triplane.sdk.tensor import build_graph

    def made(scale: float) -> tuple[Any, np.ndarray]:
        t = tp.tanh(tp.arange(0, n * n, dtype="float32").reshape((n, n)) * scale)
        return t, np.tanh(np.arange(n * n, dtype=np.float32).reshape(n, n) * np.float32(scale))

    (a, ra), (b, rb) = made(1e-7), made(3e-8)
    graph = build_graph([(a @ b).sum(axis=1)])[0].to_dict()
    out = graph["outputs"][0]
    url = c.url("sched-a")
    r = c.http("POST", url + "/v1/jobs", json={"graph": graph, "fetch": [out]})
    r.raise_for_status()
    job = r.json()["id"]
    while True:
        body = c.http("GET", url + f"/v1/jobs/{job}/wait", params={"timeout": 10}, timeout=20).json()
        if body["state"] != "running" and body["state"] != "queued":
            break
    if body["state"] != "done":
        raise RuntimeError(f"the matmul job ended {body['state']}: {body.get('error')}")
    got = np.frombuffer(c.http("GET", url + f"/v1/jobs/{job}/tensors/{out}").content, np.float32)
    np.testing.assert_allclose(got, (ra @ rb).sum(axis=1), rtol=1e-3)
    c.http("DELETE", url + f"/v1/jobs/{job}")


class MLP:
    """bench/train.py's large model on the cluster, driven from the client host."""

    def __init__(self, c: hostcluster.MultiHost) -> None:
        from train_systems import Triplane, init_weights, make_data, parse_model

        from triplane.sdk.remote import RemoteSession

        model = parse_model("large", "1024-2048-2048-10:512", "synthetic")
        self.data = make_data(model)
        self.i = 0
        url = c.url("sched-a")

        def opened() -> Any:
            return RemoteSession(url, hostcluster.TOKEN, timeout_s=120.0, job_timeout_s=300.0)

        self.session = c.net["client"].call(opened)
        holder = type("Cluster", (), {"session": self.session})()
        self.system = c.net["client"].call(Triplane, model, init_weights(model), holder)

    def step(self) -> None:
        x, y = self.data[self.i % len(self.data)]
        self.i += 1
        self.system.step(x, y)

    def close(self) -> None:
        self.session.close()


def measure(c: hostcluster.MultiHost, run: Any, rounds: int, watched: list[str]) -> dict[str, Any]:
    """Seconds of each round of ``run()`` (on the client host) and the bytes moved per host."""
    times = []
    links0 = {h: c.net.link_bytes(h) for h in watched}
    peer0 = {n: s.get("tasks_peer_bytes", 0) for n, s in c.executor_stats().items()}
    for _ in range(rounds):
        t = time.perf_counter()
        c.net["client"].call(run)
        times.append(time.perf_counter() - t)
    time.sleep(1.5)  # executors publish their counters every second
    links = {h: c.net.link_bytes(h) for h in watched}
    peer = {n: s.get("tasks_peer_bytes", 0) - peer0.get(n, 0) for n, s in c.executor_stats().items()}
    moved = {h: (links[h]["tx"] + links[h]["rx"] - links0[h]["tx"] - links0[h]["rx"]) / rounds
             for h in watched}
    return {"seconds": times, "best_s": min(times), "median_s": statistics.median(times),
            "link_bytes_per_round": moved, "peer_bytes_per_round": {n: v / rounds for n, v in peer.items()}}


def run_layout(n_exec: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="triplane-bench-hosts-") as tmp, \
            hostcluster.running(Path(tmp), schedulers=("sched-a",), executors=LAYOUTS[n_exec],
                                bound_s=args.bound, executor_env=ONE_BLAS_THREAD) as c:
        watched = [h for h in WATCHED if h in ("sched-a", "client") or h in LAYOUTS[n_exec]]
        c.net["client"].call(matmul_round, c, args.n)  # warm-up: plans, calibration
        out["matmul"] = measure(c, lambda: matmul_round(c, args.n), args.rounds, watched)
        print(f"{n_exec} executor host(s): matmul {args.n} best {out['matmul']['best_s']:.2f} s", flush=True)
        mlp = MLP(c)
        try:
            for _ in range(args.warmup):
                c.net["client"].call(mlp.step)

            def steps() -> None:
                for _ in range(args.steps):
                    mlp.step()

            res = measure(c, steps, args.rounds, watched)
            res["ms_per_step"] = [1000 * s / args.steps for s in res["seconds"]]
            out["mlp"] = res
            print(f"{n_exec} executor host(s): MLP step best {min(res['ms_per_step']):.0f} ms", flush=True)
        finally:
            c.net["client"].call(mlp.close)
    return out


def _mib(x: float) -> str:
    return f"{x / 2**20:,.1f}"


def report(results: dict[int, dict[str, dict[str, Any]]], args: argparse.Namespace) -> str:
    headers = ["workload", "executor hosts", "best", "median", "scheduler host MiB", "client host MiB",
               "each executor host MiB (link)", "peer pulls MiB (per executor)"]
    rows = []
    for key, label in (("matmul", f"matmul {args.n}x{args.n} (s)"), ("mlp", "large MLP step (ms)")):
        for n_exec, res in sorted(results.items()):
            r = res[key]
            vals = r["ms_per_step"] if key == "mlp" else r["seconds"]
            best, med = min(vals), statistics.median(vals)
            links = r["link_bytes_per_round"]
            execs = LAYOUTS[n_exec]
            rows.append([label, str(n_exec), f"{best:,.2f}" if key == "matmul" else f"{best:,.0f}",
                         f"{med:,.2f}" if key == "matmul" else f"{med:,.0f}",
                         _mib(links["sched-a"]), _mib(links["client"]),
                         " / ".join(_mib(links[h]) for h in execs),
                         " / ".join(_mib(r["peer_bytes_per_round"].get(h, 0)) for h in execs)])
    table = markdown_table(headers, rows, [False, True, True, True, True, True, True, True])
    return (f"# Three executor hosts against one (bench/hosts.py)\n\n{table}\n\n"
            f"Bytes are per round (a matmul job, or {args.steps} MLP steps), sent + received on each host's "
            "link (veth counters), and the executors' own count of tile bytes pulled from another executor. "
            f"{args.rounds} rounds after a warm-up; every host shares this machine's CPUs.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="matmul size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="MLP steps per round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed MLP steps")
    ap.add_argument("--bound", type=float, default=1800.0, help="seconds before everything is stopped")
    ap.add_argument("--quick", action="store_true", help="one round, 2 steps")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 2, 1
    why = hostcluster.missing()
    if why:
        print(f"bench/hosts.py cannot run here: {why}", file=sys.stderr)
        raise SystemExit(2)
    results = {n: run_layout(n, args) for n in (1, 3)}
    md = report(results, args)
    print(md)
    if not args.no_write:
        payload = {"args": vars(args), "machine": machine_facts(["numpy"]),
                   "results": {str(k): v for k, v in results.items()}}
        write_results("hosts", payload, md + "\n" + _facts_line(payload["machine"]))


def _facts_line(facts: dict[str, Any]) -> str:
    return "Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items() if not isinstance(v, dict)) + "\n"


if __name__ == "__main__":
    main()
