"""``triplane serve MODEL`` and ``tp.serve``: the model server (``triplane/serving/``) given
what it runs on, from the top of the package (docs/serving.md).

On a cluster (the default: ``--url``/``--token``, ``TRIPLANE_URL``/``TRIPLANE_TOKEN``, or
the run directory of ``triplane up``) every replica is a cluster session of its own;
``--embedded`` runs the model in this process instead (no cluster, for trying a model
out). The server's own tokens are the scheduler's: the run directory's admin token and
``tokens.json`` unless ``--admin-token-file``/``--tokens-file`` say otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from triplane.cli_kit import App, CliError, console

__all__ = ["register", "serve"]


def _key(key_file: Path | None) -> Any:
    """A model file's verification key: a PEM public key (Ed25519), else the file's bytes
    (an HMAC key)."""
    if key_file is None:
        return None
    raw = key_file.read_bytes()
    if raw.lstrip().startswith(b"-----BEGIN PUBLIC KEY-----"):
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        return load_pem_public_key(raw)
    return raw.strip()


def _sessions(embedded: bool, url: str | None, token: str | None, home: str | os.PathLike[str] | None
              ) -> Callable[[], Any]:
    if embedded:
        from triplane.embedded import EmbeddedSession

        return EmbeddedSession
    from triplane.sdk.remote import RemoteSession
    from triplane.sdk.remote_connect import resolve_target

    url, token = resolve_target(url, token, home)
    # No checkpoints: a served model's parameters are uploads (kept by the scheduler), not
    # values computed on an executor, so an executor lost costs a retry, not a restore.
    return lambda: RemoteSession(url, token, checkpoint_every=0)


def serve(model: str | os.PathLike[str], *, url: str | None = None, token: str | None = None,
          home: str | os.PathLike[str] | None = None, embedded: bool = False, host: str = "127.0.0.1",
          port: int = 8080, grpc_port: int | None = None, replicas: int = 1, max_batch: int = 32,
          max_wait_ms: float = 5.0, retries: int = 2, key: Any = None, admin_token: str | None = None,
          tokens_file: str | os.PathLike[str] | None = None, block: bool = True) -> Any:
    """Serve the model file ``model`` over HTTP (and gRPC with ``grpc_port``; 0 picks a
    port) until stopped; with ``block=False`` serve from a background thread and return
    the :class:`~triplane.serving.ModelServer` (``.url``, ``.grpc_address``,
    ``.reload()``, ``.stop()``) once it listens.

    Runs on the cluster ``url``/``token``/``home`` name (as ``tp.connect``) unless
    ``embedded``. ``admin_token``/``tokens_file`` default to those of the run directory
    (``home``); ``key`` verifies a signed model file (as ``tp.load_model``)."""
    from triplane.launcher.rundir import RunDir
    from triplane.sdk.model import load_model
    from triplane.serving import ModelServer, ServeOptions

    run = RunDir(home)
    if admin_token is None:
        admin_token = run.read_token()
    if tokens_file is None and run.tokens_file.exists():
        tokens_file = run.tokens_file
    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    options = ServeOptions(host=host, port=port, grpc_port=grpc_port, replicas=replicas, max_batch=max_batch,
                           max_wait_ms=max_wait_ms, retries=retries, admin_token=admin_token,
                           tokens_file=Path(tokens_file) if tokens_file is not None else None)
    server = ModelServer(path, options, loader=load_model, sessions=_sessions(embedded, url, token, home),
                         key=key)
    if not block:
        return server.start()
    server.run()
    return server


def serve_command(
    model: Annotated[Path, typer.Argument(help="the model file (tp.save_model)", exists=True,
                                          dir_okay=False)],
    port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP port (0: any free port)")] = 8080,
    grpc_port: Annotated[int | None, typer.Option(min=0, max=65535, help="gRPC port (default: none)")] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    replicas: Annotated[int, typer.Option(min=1, max=64, help="replicas (each its own session "
                                                                    "and executor)")] = 1,
    max_batch: Annotated[int, typer.Option(min=1, max=4096, help="rows per batch (1: no batching)")] = 32,
    max_wait_ms: Annotated[float, typer.Option(min=0, max=10_000, help="how long a batch waits to "
                                                                        "fill")] = 5.0,
    embedded: Annotated[bool, typer.Option("--embedded", help="run in this process, no cluster")] = False,
    key_file: Annotated[Path | None, typer.Option(help="verify the model's signature: an HMAC key, or "
                                                       "an Ed25519 public key (PEM)")] = None,
    admin_token_file: Annotated[Path | None, typer.Option(help="the server's admin token (default: the "
                                                               "run directory's)")] = None,
    tokens_file: Annotated[Path | None, typer.Option(help="client tokens (default: the run directory's "
                                                          "tokens.json)")] = None,
    ready_file: Annotated[Path | None, typer.Option(help="write {url, grpc, pid, version} here once "
                                                        "serving")] = None,
    home: Annotated[Path | None, typer.Option("--home", help="run directory of `triplane up`")] = None,
    url: Annotated[str | None, typer.Option("--url", help="the scheduler's URL")] = None,
    token: Annotated[str | None, typer.Option("--token", help="bearer token for the cluster")] = None,
) -> None:
    """Serve a model file: predict over HTTP (and gRPC), batching concurrent requests.
    SIGHUP or POST /v1/reload (admin) loads a new version without dropping requests."""
    import logging

    from triplane.proto.errors import TriplaneError
    from triplane.sdk.model import load_model
    from triplane.serving import ModelServer, ServeOptions

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("triplane").setLevel(logging.INFO)  # its own lines; libraries at WARNING
    try:
        from triplane.launcher.rundir import RunDir

        run = RunDir(home)
        admin = admin_token_file.read_text().strip() if admin_token_file else run.read_token()
        book = tokens_file if tokens_file is not None else (
            run.tokens_file if run.tokens_file.exists() else None)
        options = ServeOptions(host=host, port=port, grpc_port=grpc_port, replicas=replicas,
                               max_batch=max_batch, max_wait_ms=max_wait_ms, admin_token=admin,
                               tokens_file=book, ready_file=ready_file)
        server = ModelServer(model, options, loader=load_model,
                             sessions=_sessions(embedded, url, token, home), key=_key(key_file))
        server.run()
    except (TriplaneError, OSError) as e:
        raise CliError(str(e)) from None
    console.print("model server stopped")


def register(app: App) -> None:
    app.command("serve")(serve_command)
