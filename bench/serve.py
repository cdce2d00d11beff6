"""The model server under load, on loopback: latency and throughput with and without
dynamic batching, and what a reload and a lost executor cost.

    python bench/serve.py                                   # about 2 minutes
    python bench/serve.py --requests 40 --clients 1,4       # a quick look

A local cluster (``--executors`` executors) and ``triplane serve`` as its own process
(``--replicas`` replicas) serving the LeNet-style CNN of examples/train_digits_cnn.py
(untrained weights: the work per request is the same). Clients are asyncio tasks in this
process, one connection each, each sending one image (1, 1, 8, 8) per request and
waiting for its answer before the next: over HTTP (a keep-alive connection, ``POST
/v1/predict`` as JSON) and over gRPC (a channel, ``Predict`` with the raw bytes;
``--protocols``). Each row sends ``--requests`` requests (at most ``--time-limit-s``
seconds) with 1, 8 and 64 clients, against a server that batches (``--max-batch``,
``--max-wait-ms``) and one that does not (``--max-batch 1``).

Then, with batching and 8 clients over HTTP: a row during which the model is reloaded
(``POST /v1/reload`` with a second model file, a third of the way in; the row goes on until
the new version answers), and a row during which executor 0 is SIGKILLed (a third of the
way in). Every request is counted; an error
is any answer but 200. The server retries a batch whose run failed transiently at most
twice (``retries``, ``/metrics``): the lost executor's row reports how many it took.

Results: bench/results/serve.{json,md} (``--results-dir``, ``--name``) with the machine's
facts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, machine_facts, markdown_table, write_results

ROOT = Path(__file__).resolve().parents[1]


def save_models(directory: Path) -> tuple[Path, Path]:
    """Two versions of the digits CNN (same signature, other weights)."""
    import triplane as tp
    from triplane import nn

    paths = []
    for seed in (0, 1):
        tp.manual_seed(seed)
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
        path = directory / f"cnn-v{seed + 1}.tpm"
        tp.save_model(model, [np.zeros((2, 1, 8, 8), np.float32)], path, names={"inputs": ["image"]})
        paths.append(path)
    return paths[0], paths[1]


class Server:
    """``triplane serve`` in its own process."""

    def __init__(self, model: Path, home: Path, replicas: int, max_batch: int, max_wait_ms: float) -> None:
        self.ready = home / f"serve-{max_batch}.json"
        self.log = open(home / f"serve-{max_batch}.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triplane", "serve", str(model), "--home", str(home), "--port", "0",
             "--replicas", str(replicas), "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms),
             "--grpc-port", "0", "--ready-file", str(self.ready)],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 180
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"triplane serve did not start: see {home}/serve-{max_batch}.log")
            time.sleep(0.1)
        info = json.loads(self.ready.read_text())
        self.url, self.grpc = info["url"], info["grpc"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just what a predict needs (asyncio
    streams: httpx's async pool spent more CPU than the server at 64 clients and became
    the bottleneck it was meant to measure)."""

    def __init__(self, url: str, token: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port, self.token = host, int(port), token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode() + body)
        answer = await self.reader.readuntil(b"\r\n\r\n")
        status = int(answer.split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in answer.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return status, await self.reader.readexactly(length)

    @staticmethod
    def payload(image: np.ndarray) -> bytes:
        return json.dumps({"inputs": {"image": image.tolist()}}).encode()

    async def predict(self, payload: bytes) -> tuple[bool, str]:
        """(answered, its model version or what went wrong)."""
        status, body = await self.post("/v1/predict", payload)
        if status != 200:
            return False, f"{status}: {body[:200]!r}"
        return True, json.loads(body)["model_version"]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class GrpcConnection:
    """One gRPC channel calling ``Predictor.Predict`` (grpc.aio, on the benchmark's loop)."""

    def __init__(self, address: str, token: str) -> None:
        import grpc

        from triplane.serving import serving_pb2 as pb
        from triplane.serving import serving_pb2_grpc as pb_grpc

        self.grpc, self.pb = grpc, pb
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = pb_grpc.PredictorStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)

    @staticmethod
    def payload(image: np.ndarray) -> Any:
        from triplane.serving import serving_pb2 as pb

        return pb.PredictRequest(inputs={"image": pb.Tensor(dtype="float32", shape=list(image.shape),
                                                            data=image.tobytes())})

    async def predict(self, payload: Any) -> tuple[bool, str]:
        """(answered, its model version or what went wrong)."""
        try:
            reply = await self.stub.Predict(payload, metadata=self.metadata, timeout=120)
        except self.grpc.aio.AioRpcError as e:
            return False, f"{e.code().name}: {e.details()}"
        return True, reply.model_version

    def close(self) -> None:
        task = asyncio.get_running_loop().create_task(self.channel.close())
        CLOSING.add(task)
        task.add_done_callback(CLOSING.discard)


CLOSING: set[asyncio.Task[Any]] = set()


async def load(server: Server, token: str, clients: int, requests: int, time_limit_s: float,
               events: dict[int, Any] | None = None, protocol: str = "http") -> dict[str, Any]:
    """``requests`` predicts from ``clients`` concurrent clients (one connection each, over
    ``protocol``: "http" or "grpc"); latencies and errors. ``events``: request index -> a
    coroutine function run (once) when that request is sent; the clients go on past
    ``requests`` until every event is over, and a little after."""
    rng = np.random.default_rng(0)
    kind = Connection if protocol == "http" else GrpcConnection
    payloads = [kind.payload(rng.random((1, 1, 8, 8)).round(4).astype(np.float32)) for _ in range(64)]

    def connect() -> Connection | GrpcConnection:
        return Connection(server.url, token) if protocol == "http" else GrpcConnection(server.grpc, token)
    latencies: list[float] = []
    errors: list[str] = []
    versions: dict[str, int] = {}
    sent = 0
    pending_events: list[asyncio.Task[Any]] = []
    deadline = time.monotonic() + time_limit_s
    events_over_at: int | None = None  # requests sent when the last event ended

    def more() -> bool:
        """Go on to ``requests``, and past it while an event runs and for two requests per
        client after it ended (so answers after a reload come from the new version)."""
        nonlocal events_over_at
        if time.monotonic() >= deadline:
            return False
        if sent < requests:
            return True
        if not pending_events:
            return False
        if any(not t.done() for t in pending_events):
            return True
        if events_over_at is None:
            events_over_at = sent
        return sent < events_over_at + 2 * clients

    async def worker() -> None:
        nonlocal sent
        conn = connect()
        try:
            while more():
                i = sent
                sent += 1
                if events and i in events:
                    pending_events.append(asyncio.create_task(events[i]()))
                t0 = time.perf_counter()
                try:
                    ok, said = await conn.predict(payloads[i % len(payloads)])
                except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration) as e:
                    errors.append(f"{type(e).__name__}: {e}")
                    conn.close()
                    conn = connect()
                    continue
                if not ok:
                    errors.append(said)
                    continue
                latencies.append(time.perf_counter() - t0)
                versions[said] = versions.get(said, 0) + 1
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    for t in pending_events:
        await t
    await asyncio.gather(*CLOSING)
    ms = np.array(latencies) * 1000
    return {"protocol": protocol, "clients": clients, "sent": sent, "ok": len(latencies), "errors": errors,
            "elapsed_s": elapsed,
            "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
            "throughput": len(latencies) / elapsed if elapsed else None, "versions": versions}


def tasks_by_node(metrics: str) -> dict[str, int]:
    """Tasks that succeeded on each executor (the scheduler's ``triplane_tasks_succeeded``)."""
    done: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("triplane_tasks_succeeded") and 'node="' in line:
            node = line.split('node="', 1)[1].split('"', 1)[0]
            done[node] = done.get(node, 0) + int(float(line.split()[-1]))
    return done


def measure(server: Server, token: str, clients: int, args: argparse.Namespace, scheduler: str,
            events: dict[int, Any] | None = None, protocol: str = "http") -> dict[str, Any]:
    import httpx

    h = {"Authorization": f"Bearer {token}"}
    before = httpx.get(f"{server.url}/metrics", headers=h).text
    ran = tasks_by_node(httpx.get(f"{scheduler}/metrics", headers=h).text)
    row = asyncio.run(load(server, token, clients, args.requests, args.time_limit_s, events, protocol))
    after = httpx.get(f"{server.url}/metrics", headers=h).text
    now = tasks_by_node(httpx.get(f"{scheduler}/metrics", headers=h).text)
    row["tasks_by_node"] = {n: now.get(n, 0) - ran.get(n, 0) for n in sorted(set(now) | set(ran))}
    def grew(name: str) -> float:
        return metric(after, f"triplane_serve_{name}") - metric(before, f"triplane_serve_{name}")

    batches, rows = grew("batch_rows_count"), grew("batch_rows_sum")
    row["rows_per_batch"] = rows / batches if batches else None
    row["retries"] = grew("retries_total")
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from triplane.launcher import ClusterConfig, LocalCluster

    load_before = os.getloadavg()[0]  # a shared machine: other work moves the figures
    with tempfile.TemporaryDirectory(prefix="triplane-bench-serve-") as tmp:
        home = Path(tmp)
        v1, v2 = save_models(home)
        cluster = LocalCluster(home / "run", ClusterConfig(executors=args.executors, memory="512MiB",
                                                           log_level="warning"))
        cluster.start()
        rows: list[dict[str, Any]] = []
        chaos: list[dict[str, Any]] = []
        try:
            token = cluster.token
            # Without batching first: the executor SIGKILLed in the last row of the batching
            # server is gone for every row after it.
            for max_batch in (1, args.max_batch):
                server = Server(v1, cluster.run.path, args.replicas, max_batch, args.max_wait_ms)
                try:
                    for protocol in args.protocols:
                        asyncio.run(load(server, token, 2, 8, 60, protocol=protocol))  # connections warm
                        for clients in args.clients:
                            row = measure(server, token, clients, args, cluster.url, protocol=protocol)
                            row["batching"] = max_batch > 1
                            rows.append(row)
                            print(f"{protocol} batching={max_batch > 1} clients={clients}: {row['ok']}/"
                                  f"{row['sent']} ok, p50 {fmt(row['p50_ms'], 1)} ms, p99 "
                                  f"{fmt(row['p99_ms'], 1)} ms, {fmt(row['throughput'], 1)}/s", flush=True)
                    if max_batch > 1:
                        third = args.requests // 3

                        async def reload(url: str = server.url) -> None:
                            async with httpx.AsyncClient(timeout=120) as c:
                                r = await c.post(f"{url}/v1/reload", json={"path": str(v2)},
                                                 headers={"Authorization": f"Bearer {token}"})
                                r.raise_for_status()

                        async def kill() -> None:
                            cluster.kill_executor(0, signal.SIGKILL)

                        for event, fn in (("reload", reload), ("executor SIGKILLed", kill)):
                            row = measure(server, token, 8, args, cluster.url, {third: fn})
                            row["event"] = event
                            chaos.append(row)
                            print(f"{event}: {row['ok']}/{row['sent']} ok, {len(row['errors'])} errors, "
                                  f"retries {row['retries']:.0f}, versions {row['versions']}", flush=True)
                finally:
                    server.stop()
        finally:
            cluster.stop()
    rows.sort(key=lambda r: (not r["batching"], args.protocols.index(r["protocol"]),
                             args.clients.index(r["clients"])))
    return {"rows": rows, "chaos": chaos, "load": [load_before, os.getloadavg()[0]]}


def report(result: dict[str, Any], args: argparse.Namespace) -> str:
    head = ["protocol", "batching", "clients", "requests", "errors", "p50 ms", "p99 ms", "requests/s",
            "rows/batch", "tasks per executor"]
    body = [[r["protocol"], "yes" if r["batching"] else "no", str(r["clients"]), str(r["sent"]),
             str(len(r["errors"])), fmt(r["p50_ms"], 1), fmt(r["p99_ms"], 1), fmt(r["throughput"], 1),
             fmt(r["rows_per_batch"], 2), " / ".join(str(n) for _, n in sorted(r["tasks_by_node"].items()))]
            for r in result["rows"]]
    chaos_head = ["during the run", "clients", "requests", "errors", "p50 ms", "p99 ms", "server retries",
                  "answers by version", "tasks per executor"]
    chaos = [[r["event"], str(r["clients"]), str(r["sent"]), str(len(r["errors"])), fmt(r["p50_ms"], 1),
              fmt(r["p99_ms"], 1), f"{r['retries']:.0f}",
              ", ".join(f"{k}: {v}" for k, v in r["versions"].items()),
              " / ".join(str(n) for _, n in sorted(r["tasks_by_node"].items()))]
             for r in result["chaos"]]
    return "\n".join([
        "# Model server under load (bench/serve.py)", "",
        f"`python bench/serve.py --requests {args.requests} --clients {','.join(map(str, args.clients))}` "
        f"- a local cluster of {args.executors} executors, `triplane serve` with {args.replicas} replicas, "
        f"the digits CNN, one image per request (on loopback: JSON over HTTP, raw bytes over gRPC); "
        f"batching: max batch {args.max_batch}, max wait {args.max_wait_ms} ms. Clients run in the "
        "benchmark's process on the same machine; its load average (1 min) was "
        f"{result['load'][0]:.1f} at the start and {result['load'][1]:.1f} at the end.", "",
        markdown_table(head, body, [False, False] + [True] * 8), "",
        "With batching and 8 clients over HTTP, an event a third of the way in:", "",
        markdown_table(chaos_head, chaos, [False] + [True] * 6 + [False, True]), "",
        "Tasks per executor: the tasks each executor ran during the row (the scheduler's "
        "`triplane_tasks_succeeded`, by executor name), one per batch.", "",
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--requests", type=int, default=300, help="requests per row")
    p.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64])
    p.add_argument("--protocols", type=lambda s: s.split(","), default=["http", "grpc"])
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--time-limit-s", type=float, default=60.0, help="per row")
    p.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="serve")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    text = report(result, args)
    print(text)
    payload = {"benchmark": "serve", "args": {k: str(v) for k, v in vars(args).items()}, **result,
               "machine": machine_facts(["triplane", "fastapi", "uvicorn", "httpx"])}
    write_results(args.name, payload, text, args.results_dir)
    errors = sum(len(r["errors"]) for r in result["rows"] + result["chaos"])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
