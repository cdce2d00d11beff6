"""The model server, put together: a :class:`~triplane.serving.host.ModelHost` behind the
HTTP app and, optionally, the gRPC service, on one event loop.

:class:`ModelServer` is what ``triplane serve`` and ``tp.serve`` run (the top of the
package gives it the model loader and how to make sessions: the SDK's cluster session or
the embedded one). ``run()`` serves until SIGTERM/SIGINT; SIGHUP reloads the model file
(as ``POST /v1/reload``). ``start()`` serves from a background thread and returns once
both ports listen (tests, notebooks, examples); ``stop()`` ends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triplane.scheduler.api.auth import Authenticator
from triplane.serving.host import ModelHost, Version
from triplane.serving.metrics import ServeMetrics

__all__ = ["ModelServer", "ServeOptions"]

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    """Where and how to serve. ``port``/``grpc_port`` 0: any free port; ``grpc_port``
    None: no gRPC. ``admin_token`` and ``tokens_file`` are the scheduler's (the same
    token book); with neither, every call but health is refused."""

    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = None
    replicas: int = 1
    max_batch: int = 32
    max_wait_ms: float = 5.0
    retries: int = 2
    admin_token: str | None = None
    tokens_file: Path | None = None
    ready_file: Path | None = None


class ModelServer:
    def __init__(self, path: str | Path, options: ServeOptions, *, loader: Callable[..., Any],
                 sessions: Callable[[], Any], key: Any = None) -> None:
        self.options = options
        self.metrics = ServeMetrics()
        self.host = ModelHost(path, loader=loader, sessions=sessions, replicas=options.replicas,
                              max_batch=options.max_batch, max_wait_s=options.max_wait_ms / 1000,
                              retries=options.retries, key=key, metrics=self.metrics)
        self.auth = Authenticator(options.admin_token, tokens_file=options.tokens_file)
        self.url: str | None = None
        self.app: Any = None  # the FastAPI app, once serving
        self.grpc_address: str | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def version(self) -> str | None:
        return self.host.current.version if self.host.current else None

    def reload(self, path: str | Path | None = None) -> Version:
        return self.host.reload(path)

    async def serve(self, install_signals: bool = False) -> None:
        """Load the model, listen, serve until stopped."""
        import uvicorn

        from triplane.net.http import guarded_config
        from triplane.serving.http import make_app

        o = self.options
        await asyncio.to_thread(self.host.start)
        app = self.app = make_app(self.host, self.auth)
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on the connections of a socket whose
        # proto says TCP; without it each answer (head, then body) waited ~40 ms for the
        # client's delayed ACK (bench/serve.py measured 44 ms for GET /v1/health).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((o.host, o.port))
        except OSError as e:
            self.host.close()
            raise OSError(f"cannot listen on {o.host}:{o.port}: {e.strerror}") from None
        server = uvicorn.Server(guarded_config(app, log_level="warning", access_log=False, lifespan="off"))
        loop = asyncio.get_running_loop()
        self._loop, self._stop = loop, asyncio.Event()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
            loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self._reload_on_signal()))
        grpc_server = None
        try:
            serving = loop.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.01)
            self.url = f"http://{o.host}:{sock.getsockname()[1]}"
            if o.grpc_port is not None:
                from triplane.serving.grpc_service import serve_grpc

                grpc_server, bound = await serve_grpc(self.host, self.auth, o.host, o.grpc_port)
                self.grpc_address = f"{o.host}:{bound}"
            log.info("model server on %s (gRPC %s), model version %s", self.url, self.grpc_address,
                     self.version)
            if o.ready_file is not None:
                tmp = o.ready_file.with_name(o.ready_file.name + ".tmp")
                tmp.write_text(json.dumps({"url": self.url, "grpc": self.grpc_address, "pid": os.getpid(),
                                           "version": self.version}) + "\n")
                os.replace(tmp, o.ready_file)
            self._ready.set()
            stopping = loop.create_task(self._stop.wait())
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            server.should_exit = True
            if grpc_server is not None:
                await grpc_server.stop(1.0)
            await asyncio.wait_for(serving, 10)
        finally:
            await asyncio.to_thread(self.host.close)

    async def _reload_on_signal(self) -> None:
        try:
            v = await asyncio.to_thread(self.host.reload)
            log.warning("SIGHUP: now serving version %s", v.version)
        except Exception as e:  # the old version stays in service
            log.error("SIGHUP: reload failed, the previous version stays: %s", e)

    def run(self) -> None:
        """Serve in this thread until SIGTERM or SIGINT (SIGHUP reloads)."""
        asyncio.run(self.serve(install_signals=True))

    # --- in the background -------------------------------------------------------------

    def start(self, timeout_s: float = 300.0) -> ModelServer:
        """Serve from a background thread; returns once listening (the load's error if it
        failed)."""

        def main() -> None:
            try:
                asyncio.run(self.serve())
            except BaseException as e:
                self._error = e
                self._ready.set()

        self._thread = threading.Thread(target=main, name="triplane-model-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the model server did not start within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> ModelServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
