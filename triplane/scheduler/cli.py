"""``triplane scheduler``: run the scheduler (REST API + dispatcher) until SIGTERM/SIGINT.

``scheduler_command`` is a plain function with typer-compatible parameters; the
``triplane`` CLI mounts it (``app.command("scheduler")(scheduler_command)``). uvicorn
serves the FastAPI app on the same asyncio loop as the dispatcher (uvloop where
installed); with ``--grpc-port`` (0: any free port), the gRPC service of
``proto/triplane.proto`` (docs/grpc.md) is served beside it on the same loop, with the
same tokens, and its address is written to the ready file as ``"grpc"``. The admin token
and cluster secret come from ``--token-file`` / ``--secret-file`` or ``TRIPLANE_TOKEN`` /
``TRIPLANE_SECRET``; without either, fresh ones
are written (mode 0600) to the run directory. More client tokens (admin, submit, read)
are listed in ``--tokens-file`` (default ``<run dir>/tokens.json``, re-read when it
changes; docs/security.md). Bad options exit with status 2 and one
line; on SIGTERM the scheduler stops serving, flushes metadb and resigns leadership.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from triplane.process import event_loop_runner, prepare_process

# scheduler/retention.py's defaults (not imported: that pulls in SQLAlchemy at CLI start)
KEEP_JOBS = 100
PERIOD_S = 1.0
WHOLE_COMPUTE_S = 0.5  # compiler/layout.py's (a test checks they agree)

__all__ = ["run_scheduler", "scheduler_command"]

log = logging.getLogger("triplane.scheduler")


class _Usage(Exception):
    pass


def _secret_value(path: Path | None, env: str, fallback: Path, min_len: int) -> bytes:
    """From ``path``, else ``$env``, else the systemd credential (``token``/``secret``), else
    ``fallback`` (created with a fresh value, 0600)."""
    from triplane.config import ConfigError, credential

    name = env.removeprefix("TRIPLANE_").lower()
    try:
        found = credential(name, path, env)
    except ConfigError as e:
        raise _Usage(str(e)) from None
    if found is not None:
        value = found[0]
    else:
        if not fallback.exists():
            fallback.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(fallback, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        value = fallback.read_bytes().strip()
    if len(value) < min_len:
        raise _Usage(f"{env.lower()} must be at least {min_len} bytes")
    return value


async def _serve(
    registry: str,
    db: str | None,
    host: str,
    port: int,
    packet_port: int,
    data_port: int,
    run_dir: Path,
    token: bytes,
    secret: bytes,
    max_upload_bytes: int,
    ready_file: Path | None,
    slots: int,
    tokens_file: Path | None = None,
    session_ttl_s: float = 30.0,
    keep_jobs: int | None = KEEP_JOBS,
    retention_period_s: float = PERIOD_S,
    grpc_port: int | None = None,
    advertise: str | None = None,
    whole_s: float = WHOLE_COMPUTE_S,
) -> int:
    import uvicorn

    from triplane import metadb as mdb
    from triplane.net.http import guarded_config
    from triplane.registry import connect_registry
    from triplane.scheduler.api.app import create_app
    from triplane.scheduler.service import Scheduler

    try:
        backend = connect_registry(registry, secret=secret)  # http://: the node credential
    except ValueError as e:
        raise _Usage(str(e)) from None
    address = advertise or host
    database = await asyncio.to_thread(mdb.open_db, db, run_dir=run_dir)
    sched = Scheduler(
        registry=backend,
        db=database,
        run_dir=run_dir,
        secret=secret,
        host=host,
        advertise=address,
        packet_port=packet_port,
        data_port=data_port,
        scheduler_id=f"{address}:{port}",
        elect=registry.startswith("etcd://"),
        max_upload_bytes=max_upload_bytes,
        slots=slots,
        session_ttl_s=session_ttl_s,
        keep_jobs=keep_jobs,
        retention_period_s=retention_period_s,
    )
    sched.cluster.whole_s = whole_s
    app = create_app(sched, token, tokens_file=tokens_file)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        raise _Usage(f"cannot listen on {host}:{port}: {e.strerror}") from None
    # The REST API (and the registry it may serve) with a deadline on each request's head
    # and a connection cap: no half-open connection holds the port (docs/security.md).
    server = uvicorn.Server(guarded_config(app, log_level="warning", access_log=False, lifespan="off"))
    grpc_server, grpc_address = None, None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await sched.start()
        serving = loop.create_task(server.serve(sockets=[sock]))
        # The ready file promises a listening socket: uvicorn listens in its startup, after
        # this task first runs (a client reading the file early was refused under load).
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        bound = sock.getsockname()[1]
        if grpc_port is not None:
            from triplane.scheduler.grpc.service import serve as serve_grpc

            try:  # the REST app's Authenticator: one token book for both front doors
                grpc_server, bound_grpc = await serve_grpc(sched, app.state.auth, host, grpc_port,
                                                           max_upload_bytes=max_upload_bytes)
            except OSError as e:
                raise _Usage(str(e)) from None
            grpc_address = f"{address}:{bound_grpc}"
            log.info("gRPC on %s", grpc_address)
        log.info(
            "scheduler %s on http://%s:%d (listening on %s; packets %d, data %d, role %s)",
            sched.id,
            address,
            bound,
            host,
            sched.shell.port,
            sched.data_port,
            sched.role,
        )
        if ready_file is not None:
            # Written whole or not at all: readers poll for it.
            tmp = ready_file.with_name(ready_file.name + ".tmp")
            tmp.write_text(
                f'{{"url": "http://{address}:{bound}", "packet_port": {sched.shell.port}, '
                f'"data_port": {sched.data_port}, "pid": {os.getpid()}, "role": "{sched.role}", '
                f'"grpc": {json.dumps(grpc_address)}}}\n'
            )
            os.replace(tmp, ready_file)
        # What start-up made (modules, the app, the metadb's engine) lives as long as the
        # process: out of the collector's way, so that its full passes stay short.
        gc.freeze()
        stopped = loop.create_task(sched.stopped.wait())
        stopping = loop.create_task(stop.wait())
        await asyncio.wait({serving, stopped, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        if grpc_server is not None:  # open streams (WatchJob) get a second to end
            await grpc_server.stop(1.0)
        await asyncio.wait_for(serving, 10)
        return 1 if sched.stopped.is_set() and not stop.is_set() else 0
    finally:
        if grpc_server is not None:
            await grpc_server.stop(0)
        await sched.close()
        await asyncio.to_thread(database.close)
        close = getattr(backend, "close", None)
        if close is not None:
            await close()


def run_scheduler(
    registry: str = "memory://",
    db: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8470,
    packet_port: int = 0,
    data_port: int = 0,
    run_dir: Path | None = None,
    token_file: Path | None = None,
    secret_file: Path | None = None,
    log_level: str = "info",
    max_upload_bytes: int = 1 << 30,
    ready_file: Path | None = None,
    slots: int = 4,
    tokens_file: Path | None = None,
    session_ttl_s: float = 30.0,
    keep_jobs: int = KEEP_JOBS,
    retention_period_s: float = PERIOD_S,
    grpc_port: int | None = None,
    advertise: str | None = None,
    whole_s: float = WHOLE_COMPUTE_S,
) -> int:
    """``scheduler_command`` returning its exit status instead of raising ``SystemExit``."""
    try:
        if not 1 <= slots <= 1024:
            raise _Usage(f"--slots must be in 1..1024, got {slots}")
        if not 0.1 <= session_ttl_s <= 86400:
            raise _Usage(f"--session-ttl must be in 0.1..86400 seconds, got {session_ttl_s:g}")
        if keep_jobs < -1:
            raise _Usage(f"--keep-jobs must be >= 0 (or -1: keep every job), got {keep_jobs}")
        if not 0.05 <= retention_period_s <= 86400:
            raise _Usage(f"--retention-period must be in 0.05..86400 seconds, got {retention_period_s:g}")
        if grpc_port is not None and not 0 <= grpc_port <= 65535:
            raise _Usage(f"--grpc-port must be in 0..65535 (0: any free port), got {grpc_port}")
        if not 0 <= whole_s <= 3600:
            raise _Usage(f"--whole-s must be in 0..3600 seconds, got {whole_s:g}")
        if log_level.lower() not in ("debug", "info", "warning", "error"):
            raise _Usage(f"bad log level {log_level!r} (one of debug, info, warning, error)")
        logging.basicConfig(
            level=log_level.upper(),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        home = Path(run_dir or os.environ.get("TRIPLANE_HOME") or Path.home() / ".triplane")
        # Uploads, the SQLite metadb and the secrets in the run dir are this user's alone.
        os.umask(0o077)
        from triplane.config import ConfigError, advertise_address

        try:
            address = advertise_address(host, advertise, registry)
        except ConfigError as e:
            raise _Usage(str(e)) from None
        token = _secret_value(token_file, "TRIPLANE_TOKEN", home / "token", 16)
        secret = _secret_value(secret_file, "TRIPLANE_SECRET", home / "secret", 16)
        prepare_process()
        runner = event_loop_runner()
        return runner(
            _serve(
                registry,
                db,
                host,
                port,
                packet_port,
                data_port,
                home,
                token,
                secret,
                max_upload_bytes,
                ready_file,
                slots,
                tokens_file if tokens_file is not None else home / "tokens.json",
                session_ttl_s,
                None if keep_jobs == -1 else keep_jobs,
                retention_period_s,
                grpc_port,
                address,
                whole_s,
            )
        )
    except _Usage as e:
        print(f"triplane scheduler: {e}", file=sys.stderr)
        return 2


def scheduler_command(
    registry: Annotated[str | None, typer.Option(
        help="memory:// (one host), etcd://HOST:PORT (config: cluster.registry)")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML config file (else $TRIPLANE_CONFIG; "
                                                     "docs/deploy.md)")] = None,
    db: Annotated[str | None, typer.Option(help="metadata DB URL (default: SQLite in the run dir)")] = None,
    bind: Annotated[str | None, typer.Option("--bind", "--host",
                                             help="address to listen on (0.0.0.0: every interface)")] = None,
    advertise: Annotated[str | None, typer.Option(
        help="address to publish (default: --bind, or with 0.0.0.0 the one routing to the registry)")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port of the REST API (default 8470)")] = None,
    packet_port: Annotated[int | None, typer.Option(help="UDP+TCP packet port (0: any free)")] = None,
    data_port: Annotated[int | None, typer.Option(
        help="TCP data port for uploaded tensors (0: any free)")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="run directory (default $TRIPLANE_HOME)")] = None,
    token_file: Annotated[Path | None, typer.Option(
        help="admin API token (else $TRIPLANE_TOKEN, else the systemd credential 'token')")] = None,
    secret_file: Annotated[Path | None, typer.Option(
        help="cluster secret (else $TRIPLANE_SECRET, else the systemd credential 'secret')")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error")] = None,
    max_upload_bytes: Annotated[int, typer.Option(help="largest tensor upload")] = 1 << 30,
    ready_file: Annotated[Path | None, typer.Option(help="write URL and ports here once serving")] = None,
    slots: Annotated[int, typer.Option(help="tasks in flight per executor")] = 4,
    tokens_file: Annotated[
        Path | None, typer.Option(help="client tokens with roles (default: <run dir>/tokens.json)")
    ] = None,
    session_ttl: Annotated[
        float, typer.Option(help="seconds a client session lease lasts unrenewed (then its values are freed)")
    ] = 30.0,
    keep_jobs: Annotated[
        int, typer.Option(help="released finished jobs whose metadb rows are kept, newest first (-1: all)")
    ] = KEEP_JOBS,
    retention_period: Annotated[
        float, typer.Option(help="seconds between two metadb retention passes")
    ] = PERIOD_S,
    grpc_port: Annotated[
        int | None, typer.Option(help="serve gRPC (docs/grpc.md) on this port too (0: any free port)")
    ] = None,
    whole_s: Annotated[
        float, typer.Option(help="a job the cost model puts under this many seconds on one executor, "
                                 "fitting a quarter of its memory, runs uncut on one "
                                 "(0: cut every job over 4 MiB)")
    ] = WHOLE_COMPUTE_S,
) -> None:
    """Run the scheduler: REST API, dispatcher and upload store, until stopped.

    Each setting comes from its flag, else the environment, else the config file, else its
    default (docs/deploy.md, "Configuration"; `triplane config show scheduler` prints them)."""
    from triplane.config import ConfigError, load

    def text(p: Path | None) -> str | None:
        return None if p is None else str(p)

    try:
        cfg = load("scheduler", {"registry": registry, "db": db, "bind": bind, "advertise": advertise,
                                 "port": port, "packet_port": packet_port, "data_port": data_port,
                                 "run_dir": text(run_dir), "token_file": text(token_file),
                                 "secret_file": text(secret_file), "log_level": log_level,
                                 "grpc_port": grpc_port}, config_file=config)
    except ConfigError as e:
        print(f"triplane scheduler: {e}", file=sys.stderr)
        raise SystemExit(2) from None

    def path(key: str) -> Path | None:
        return None if cfg[key] is None else Path(cfg[key])

    code = run_scheduler(
        cfg["registry"] or "memory://",
        cfg["db"],
        cfg["bind"],
        cfg["port"],
        cfg["packet_port"],
        cfg["data_port"],
        path("run_dir"),
        path("token_file"),
        path("secret_file"),
        cfg["log_level"],
        max_upload_bytes,
        ready_file,
        slots,
        tokens_file,
        session_ttl,
        keep_jobs,
        retention_period,
        cfg["grpc_port"],
        cfg["advertise"],
        whole_s,
    )
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    typer.run(scheduler_command)
