"""``triplane executor``: run one executor until SIGTERM/SIGINT.

``executor_command`` is a plain function with typer-compatible parameters; the ``triplane``
CLI mounts it, and ``python -m triplane.executor`` runs it on its own. Bad options (memory
size, secret, drop probability, registry URL) exit with status 2 and a one-line message;
a registry that cannot be reached at start exits with status 1. On SIGTERM or SIGINT the
node deregisters at once (its lease is revoked) and closes its sockets; on SIGKILL its
lease expires and the registry forgets it within the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from triplane.executor.config import load_secret, parse_size
from triplane.net.guard import Limits
from triplane.process import event_loop_runner, prepare_process

__all__ = ["executor_command", "main"]

log = logging.getLogger("triplane.executor")

_LEVELS = ("debug", "info", "warning", "error")


class _Usage(Exception):
    pass


async def _serve(registry: str, engines: list[str], memory_bytes: int,
                 memory_engine: tuple[str, dict[str, Any]], host: str, name: str | None, secret: bytes,
                 drop_udp: float, fault_seed: int, limits: Limits, persist: str | None = None,
                 network_delay_ms: float = 0.0, advertise: str | None = None,
                 ports: tuple[int, int] = (0, 0), network_engines: tuple[str, ...] = ("tcp", "udp")) -> int:
    from triplane.executor.daemon import Executor
    from triplane.registry import RegistryUnavailable, connect_registry

    try:
        # A registry served over http:// takes the node credential, derived from the secret.
        backend = connect_registry(registry, secret=secret)
    except ValueError as e:
        raise _Usage(str(e)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    executor = Executor(backend, secret, memory_bytes=memory_bytes, engines=engines,
                        memory_engine=memory_engine[0], memory_options=memory_engine[1], persist=persist,
                        host=host, name=name, drop_udp=drop_udp, fault_seed=fault_seed, limits=limits,
                        network_delay_ms=network_delay_ms, advertise=advertise,
                        packet_port=ports[0], data_port=ports[1], network_engines=network_engines)
    try:
        await executor.start()
    except RegistryUnavailable as e:
        log.error("cannot register with %s: %s", registry, e)
        with contextlib.suppress(Exception):
            await backend.close()
        return 1
    gc.freeze()  # start-up's objects live as long as the process: out of the collector's way
    try:
        await stop.wait()
        log.info("executor %s: shutting down", executor.name)
    finally:
        await executor.stop()
        with contextlib.suppress(Exception):
            await backend.close()
    return 0


def executor_command(
    join: Annotated[str | None, typer.Option(
        "--join", "--registry", help="the cluster's registry: etcd://HOST:PORT or http://SCHEDULER "
                                     "(config: cluster.registry)")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML config file (else $TRIPLANE_CONFIG; "
                                                     "docs/deploy.md)")] = None,
    engines: Annotated[str | None, typer.Option(help="op engines, comma-separated; auto: numpy and every "
                                                     "installed plugin")] = None,
    memory: Annotated[str | None, typer.Option(help="host memory for tiles, e.g. 768MiB, 8GiB, 1.5G")] = None,
    memory_engine: Annotated[str | None, typer.Option(
        help="memory engine for tiles: host, file:DIR, redis://HOST:PORT, a plugin's name, or "
             "host,file:DIR[@SIZE] (spill to DIR at capacity)")] = None,
    persist_to: Annotated[str | None, typer.Option(
        help="where persisted jobs' tiles are kept too: file:DIR (shared), redis://HOST:PORT/DB "
             "(default $TRIPLANE_PERSIST_TO)")] = None,
    bind: Annotated[str | None, typer.Option("--bind", "--host",
                                             help="address to listen on (0.0.0.0: every interface)")] = None,
    advertise: Annotated[str | None, typer.Option(
        help="address to publish (default: --bind, or with 0.0.0.0 the one routing to the registry)")] = None,
    packet_port: Annotated[int | None, typer.Option(help="UDP+TCP packet port (0: any free)")] = None,
    data_port: Annotated[int | None, typer.Option(help="TCP data port of tiles (0: any free)")] = None,
    name: Annotated[str | None, typer.Option(help="node id (default: <host>-<pid>)")] = None,
    secret_file: Annotated[Path | None, typer.Option(
        help="cluster secret; else $TRIPLANE_SECRET, else the systemd credential 'secret'")] = None,
    drop_udp: Annotated[float, typer.Option(help="drop each datagram with this probability")] = 0.0,
    fault_seed: Annotated[int, typer.Option(help="seed of the fault injection")] = 0,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error")] = None,
    idle_timeout: Annotated[float, typer.Option(help="close a TCP connection idle this many seconds")] = 10.0,
    max_connections: Annotated[int, typer.Option(help="TCP connections per port at most")] = 256,
    network_delay_ms: Annotated[float, typer.Option(help="delay every frame of the network engines "
                                                         "(tests: a slowed peer)")] = 0.0,
    network_engine: Annotated[str, typer.Option(help="the network engine that measures the links to "
                                                     "peers: tcp, udp or a plugin's name (every executor "
                                                     "of the cluster serves it)")] = "tcp",
) -> None:
    """Run an executor: join the cluster's registry, serve task packets and tiles until stopped.

    Each setting comes from its flag, else the environment, else the config file, else its
    default (docs/deploy.md, "Configuration"; `triplane config show executor` prints them)."""
    from triplane.config import ConfigError, load

    try:
        cfg = load("executor", {"registry": join, "engines": engines, "memory": memory,
                                "memory_engine": memory_engine, "bind": bind, "advertise": advertise,
                                "name": name, "packet_port": packet_port, "data_port": data_port,
                                "secret_file": None if secret_file is None else str(secret_file),
                                "log_level": log_level}, config_file=config)
        if not cfg["registry"]:
            raise ConfigError("no registry to join: pass --join URL (etcd://HOST:PORT or http://SCHEDULER), "
                              "set TRIPLANE_REGISTRY or cluster.registry in the config file")
    except ConfigError as e:
        print(f"triplane executor: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    code = run_executor(cfg["registry"], engines=cfg["engines"], memory=cfg["memory"],
                        memory_engine=cfg["memory_engine"], persist_to=persist_to, host=cfg["bind"],
                        advertise=cfg["advertise"], name=cfg["name"],
                        secret_file=None if cfg["secret_file"] is None else Path(cfg["secret_file"]),
                        drop_udp=drop_udp, fault_seed=fault_seed, log_level=cfg["log_level"],
                        idle_timeout=idle_timeout, max_connections=max_connections,
                        network_delay_ms=network_delay_ms, ports=(cfg["packet_port"], cfg["data_port"]),
                        network_engine=network_engine)
    if code:
        raise SystemExit(code)


def run_executor(registry: str, *, engines: str = "auto", memory: str = "8GiB", memory_engine: str = "host",
                 persist_to: str | None = None,
                 host: str = "127.0.0.1", name: str | None = None, secret_file: Path | None = None,
                 advertise: str | None = None, drop_udp: float = 0.0, fault_seed: int = 0,
                 log_level: str = "info",
                 idle_timeout: float = 10.0, max_connections: int = 256,
                 network_delay_ms: float = 0.0, ports: tuple[int, int] = (0, 0),
                 network_engine: str = "tcp") -> int:
    """``executor_command`` returning its exit status instead of raising ``SystemExit``."""
    try:
        if log_level.lower() not in _LEVELS:
            raise _Usage(f"bad log level {log_level!r} (one of {', '.join(_LEVELS)})")
        logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        memory_bytes = parse_size(memory)
        secret = load_secret(secret_file)
        if not 0.0 <= drop_udp < 1.0:
            raise _Usage(f"--drop-udp must be a probability in [0, 1), got {drop_udp}")
        if not network_delay_ms >= 0:
            raise _Usage(f"--network-delay-ms must be >= 0, got {network_delay_ms}")
        if not all(0 <= p <= 65535 for p in ports):
            raise _Usage(f"--packet-port and --data-port must be in 0..65535, got {ports}")
        if not idle_timeout > 0 or max_connections < 1:
            raise _Usage("--idle-timeout and --max-connections must be positive")
        limits = Limits(idle_timeout=idle_timeout, max_connections=max_connections)
        from triplane.config import advertise_address

        address = advertise_address(host, advertise, registry)
        engine_names = [e.strip() for e in engines.split(",") if e.strip()]
        if not engine_names:
            raise _Usage("--engines names no engine (e.g. --engines numpy)")
        from triplane.engines.memory.persist import persist_targets
        from triplane.engines.registry import engine_names as known
        from triplane.executor.config import parse_memory_engine

        mem_name, memory_bytes, mem_options = parse_memory_engine(memory_engine, memory_bytes)
        persist_targets(persist_to)  # a bad spec exits 2 here
        # Names only: a plugin that fails to load is isolated by the executor, not fatal here.
        memories = [mem_name, mem_options.get("primary", "host")]
        for kind, names in (("op", [e for e in engine_names if e != "auto"]), ("memory", memories),
                            ("network", [network_engine])):
            unknown = [e for e in names if e not in known(kind)]
            if unknown:
                raise _Usage(f"unknown {kind} engine {unknown[0]!r} (known: {known(kind)})")
    except (ValueError, _Usage) as e:
        print(f"triplane executor: {e}", file=sys.stderr)
        return 2
    prepare_process()
    runner = event_loop_runner()
    try:
        return runner(_serve(registry, engine_names, memory_bytes, (mem_name, mem_options), host, name,
                             secret, drop_udp, fault_seed, limits, persist_to, network_delay_ms,
                             address, ports,
                             (network_engine, *[n for n in ("tcp", "udp") if n != network_engine])))
    except _Usage as e:
        print(f"triplane executor: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> None:
    """``python -m triplane.executor``: the same options as ``triplane executor``."""
    import typer

    app = typer.Typer(add_completion=False)
    app.command()(executor_command)
    app(args=argv, prog_name="triplane executor")
