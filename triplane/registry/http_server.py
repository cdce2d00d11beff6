"""The registry served over HTTP (server side): a scheduler serves its in-memory registry.

:func:`registry_router` (or :class:`RegistryServer`, which also has ``close``) wraps any
:class:`RegistryBackend` in FastAPI routes under ``/v1/registry/``; the scheduler mounts
it with ``app.include_router(router)`` when it runs with ``--registry memory://``. The
client is :class:`triplane.registry.http.HttpBackend`. ``python -m triplane.registry.http``
runs a standalone registry server (:func:`main`).

Wire protocol (modelled on etcd's JSON gateway: every call is ``POST`` of a JSON object,
values are base64): ``put``, ``get``, ``get_prefix``, ``delete``, ``delete_prefix``,
``create``, ``compare_and_swap``, ``compare_and_delete``, ``lease/grant``,
``lease/refresh``, ``lease/ttl`` (``{"ttl_s", "left_s"}``, 404 for a lease gone),
``lease/revoke`` and ``watch``. Every route needs
``Authorization: Bearer <node credential>`` (401 otherwise; 403 for a client token the
scheduler recognises: clients never write the registry). Errors answer
``{"error": {"kind", "message"}}``: 400 malformed request, 401/403 credential, 404 lease not found,
410 watch history lost, 413 body over 1 MiB, 503 backend unavailable. No request can
crash the server or change state unless it is valid.

Watches are long polls over an event log the server keeps (the last ``log_size``
events, each with the backend's revision). ``watch`` without ``after`` returns the
current revision and the log's ``epoch`` (a random id per log); ``watch`` with them
returns the events after that revision (waiting up to ``timeout_s`` for one), so a client
that polls again from the returned revision misses nothing. If the log cannot cover the
gap (older than the log, or a restarted server: another epoch) the answer is 410 and the
client raises :class:`RegistryUnavailable`, telling the caller to re-list — unlike etcd,
a server that lost its data is always detected.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import bisect
import contextlib
import hmac
import json
import logging
import math
import secrets
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from triplane.registry.backend import (
    Entry,
    LeaseNotFound,
    RegistryBackend,
    RegistryError,
    RegistryUnavailable,
    Watch,
    WatchEvent,
    check_key,
)
from triplane.registry.credential import node_credential, node_credential_from_env

if TYPE_CHECKING:  # fastapi/starlette are imported on use: executors only need the client
    from fastapi import APIRouter
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["API_PREFIX", "MAX_LEASE_ID", "MAX_POLL_S", "RegistryServer", "b64", "main", "registry_router"]

log = logging.getLogger(__name__)

API_PREFIX = "/v1/registry"
MAX_BODY_BYTES = 1 << 20
MAX_POLL_S = 30.0
MAX_EVENTS_PER_POLL = 1000
MAX_LEASE_ID = (1 << 63) - 1


class _HttpError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object, name: str) -> bytes:
    if not isinstance(text, str):
        raise _HttpError(400, "bad_request", f"{name!r} must be a base64 string, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _HttpError(400, "bad_request", f"{name!r} is not valid base64: {exc}") from None




class _Body:
    """A request's JSON object with typed getters; unknown fields are a 400 (typos fail loudly)."""

    def __init__(self, data: object, allowed: frozenset[str]) -> None:
        if not isinstance(data, dict):
            raise _HttpError(400, "bad_request", "request body must be a JSON object")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise _HttpError(400, "bad_request",
                             f"unknown field(s) {unknown}; expected some of {sorted(allowed)}")
        self.data = data

    def key(self, name: str = "key", *, allow_empty: bool = False) -> str:
        if name not in self.data:
            raise _HttpError(400, "bad_request", f"missing field {name!r}")
        return check_key(self.data[name], allow_empty=allow_empty)

    def value(self, name: str, *, required: bool = True) -> bytes | None:
        if name not in self.data or self.data[name] is None:
            if required:
                raise _HttpError(400, "bad_request", f"missing field {name!r}")
            return None
        return _unb64(self.data[name], name)

    def integer(self, name: str, *, required: bool = False, maximum: int = MAX_LEASE_ID) -> int | None:
        got = self.data.get(name)
        if got is None:
            if required:
                raise _HttpError(400, "bad_request", f"missing field {name!r}")
            return None
        if isinstance(got, bool) or not isinstance(got, int) or not 0 <= got <= maximum:
            raise _HttpError(400, "bad_request",
                             f"{name!r} must be an integer in [0, {maximum}], got {got!r}")
        return got

    def number(self, name: str, default: float) -> float:
        got = self.data.get(name, default)
        if isinstance(got, bool) or not isinstance(got, int | float) or not math.isfinite(got) or got < 0:
            raise _HttpError(400, "bad_request", f"{name!r} must be a non-negative number, got {got!r}")
        return float(got)


class _EventLog:
    """Every change of the served backend, in revision order, for long-polling watchers.

    A pump task watches the whole backend and appends; pollers wait on an event that is
    replaced at each append. The pump belongs to one event loop: used from another (or
    after the backend's watch broke) it restarts under a new epoch, since the events in
    between are unknown and watchers must re-list.
    """

    def __init__(self, backend: RegistryBackend, size: int) -> None:
        self.backend = backend
        self.size = max(1, size)
        self.epoch = ""
        self.floor = 0  # events with revision <= floor are not (or no longer) in the log
        self.revs: list[int] = []
        self.events: list[WatchEvent] = []
        self.closed = False
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def head(self) -> int:
        """The newest revision the server knows; the store's own counter when it has one
        (MemoryBackend), so a new watch starts exactly after everything already written."""
        last = self.revs[-1] if self.revs else self.floor
        rev = getattr(getattr(self.backend, "store", None), "revision", None)
        return max(last, rev) if isinstance(rev, int) else last

    async def ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        watch = self.backend.watch_prefix("")
        await watch.start()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            await watch.cancel()  # a concurrent request started the log while we awaited
            return
        self.epoch = secrets.token_hex(8)
        self.revs, self.events = [], []
        self.floor = self.head()
        self._changed = asyncio.Event()
        self._task = loop.create_task(self._pump(watch), name="registry-http-event-log")

    async def _pump(self, watch: Watch) -> None:
        try:
            while (event := await watch.next_event()) is not None:
                self.revs.append(event.revision)
                self.events.append(event)
                if len(self.events) > 2 * self.size:  # trim in batches: amortised O(1)
                    cut = len(self.events) - self.size
                    self.floor = self.revs[cut - 1]
                    del self.revs[:cut], self.events[:cut]
                self._wake()
        except Exception as exc:  # a broken backend watch: the next request restarts the log
            log.warning("registry event log lost its backend watch: %s", exc)
        finally:
            await watch.cancel()
            self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def poll(self, prefix: str, after: int, epoch: str,
                   timeout_s: float) -> tuple[list[WatchEvent], int]:
        """Events under ``prefix`` after ``after`` (waiting up to ``timeout_s`` for one) and
        the revision to poll from next. 410 if the log cannot replay from ``after``."""
        await self.ensure_started()
        if epoch != self.epoch or after > self.head():
            raise _HttpError(410, "history_lost",
                             "the registry's watch history was lost (server restarted); re-list")
        if after < self.floor:
            raise _HttpError(410, "history_lost",
                             f"revision {after} is older than the watch log ({self.floor}); re-list")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            changed = self._changed
            found: list[WatchEvent] = []
            for event in self.events[bisect.bisect_right(self.revs, after):]:
                if event.key.startswith(prefix):
                    found.append(event)
                    if len(found) == MAX_EVENTS_PER_POLL:
                        return found, event.revision
            remaining = deadline - asyncio.get_running_loop().time()
            if found or remaining <= 0 or self.closed or self._task is None or self._task.done():
                return found, max(after, self.revs[-1] if self.revs else self.floor)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def close(self) -> None:
        self.closed = True
        self._wake()
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


Handler = Callable[[_Body], Awaitable[dict[str, Any]]]


class RegistryServer:
    """Serves ``backend`` over HTTP under ``/v1/registry/`` (see the module doc for the wire).

    ``token`` (non-empty) is the bearer credential every request must carry -- the node
    credential (``triplane.registry.credential``) where a scheduler serves it; it is
    compared in constant time. ``is_client_token(given)`` (optional) tells a client token
    apart from a wrong one, so that it gets 403 ("not for clients") instead of 401.
    :attr:`router` is a FastAPI ``APIRouter`` with full paths, so mount it
    with ``app.include_router(server.router)``. Call :meth:`close` on shutdown so pending
    long polls answer at once instead of holding the server's shutdown.
    """

    def __init__(self, backend: RegistryBackend, token: str, *, log_size: int = 10_000,
                 max_body: int = MAX_BODY_BYTES,
                 is_client_token: Callable[[str], bool] | None = None) -> None:
        from fastapi import APIRouter  # the server side only: executors need just httpx

        if not isinstance(token, str) or not token:
            raise ValueError("the served registry needs a non-empty token (the node credential)")
        self.backend = backend
        self._is_client_token = is_client_token
        self.max_body = max_body
        self._token = token.encode("utf-8")
        self._log = _EventLog(backend, log_size)
        # Lease ids on the wire are the backend's XOR a random salt: MemoryStore counts its
        # ids from a fixed base, so a restarted server would otherwise hand a client's stale
        # lease id to someone else (whose lease the stale keep-alive would then refresh).
        self._salt = secrets.randbits(62) | (1 << 61)
        self.router = APIRouter()
        b = backend
        routes: dict[str, tuple[frozenset[str], Handler]] = {
            "put": (frozenset({"key", "value", "lease"}), self._put),
            "get": (frozenset({"key"}), self._get),
            "get_prefix": (frozenset({"prefix"}), self._get_prefix),
            "delete": (frozenset({"key"}), lambda q: _wrap("deleted", b.delete(q.key()))),
            "delete_prefix": (frozenset({"prefix"}),
                              lambda q: _wrap("deleted", b.delete_prefix(q.key("prefix", allow_empty=True)))),
            "create": (frozenset({"key", "value", "lease"}), self._create),
            "compare_and_swap": (frozenset({"key", "value", "expected_value", "expected_version", "lease"}),
                                 self._cas),
            "compare_and_delete": (frozenset({"key", "expected_value", "expected_version"}), self._cad),
            "lease/grant": (frozenset({"ttl_s"}), self._grant),
            "lease/refresh": (frozenset({"lease"}), self._refresh),
            "lease/ttl": (frozenset({"lease"}), self._lease_ttl),
            "lease/revoke": (frozenset({"lease"}),
                             lambda q: _wrap("revoked", b.revoke_lease(self._lease_in(q, required=True)))),
            "watch": (frozenset({"prefix", "after", "epoch", "timeout_s"}), self._watch),
        }
        for path, (allowed, handler) in routes.items():
            self.router.add_route(f"{API_PREFIX}/{path}", self._endpoint(allowed, handler),
                                  methods=["POST"], name=f"registry_{path.replace('/', '_')}")

    async def close(self) -> None:
        """Answer pending watch polls now and stop the event log (idempotent)."""
        await self._log.close()

    # -- plumbing -------------------------------------------------------------------
    def _endpoint(self, allowed: frozenset[str],
                  handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            from starlette.responses import JSONResponse

            try:
                self._authorize(request)
                body = _Body(await self._read_json(request), allowed)
                return JSONResponse(await handler(body))
            except _HttpError as exc:
                return _error(exc.status, exc.kind, exc.message)
            except LeaseNotFound as exc:
                return _error(404, "lease_not_found", str(exc))
            except RegistryUnavailable as exc:
                return _error(503, "unavailable", str(exc))
            except RegistryError as exc:
                return _error(500, "registry", str(exc))
            except (ValueError, TypeError) as exc:  # the backend's argument checks
                return _error(400, "bad_request", str(exc))
            except Exception:
                log.exception("registry request %s failed", request.url.path)
                return _error(500, "internal", "internal error in the registry server (see its log)")
        return endpoint

    def _authorize(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise _HttpError(401, "auth", "missing bearer token (Authorization: Bearer <node credential>)")
        given = given.strip()
        if hmac.compare_digest(given.encode("utf-8", "replace"), self._token):
            return
        if self._is_client_token is not None and self._is_client_token(given):
            raise _HttpError(403, "forbidden", "a client token cannot use the registry: it takes the "
                                               "node credential, which executors and schedulers derive "
                                               "from the cluster secret")
        raise _HttpError(401, "auth", "wrong node credential")

    async def _read_json(self, request: Request) -> object:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise _HttpError(413, "too_large", f"request body over {self.max_body} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, RecursionError) as exc:
            raise _HttpError(400, "bad_request", f"request body is not valid JSON: {exc}") from None

    # -- handlers -------------------------------------------------------------------
    def _lease_in(self, q: _Body, name: str = "lease", *, required: bool = False) -> int:
        wire = q.integer(name, required=required) or 0
        return wire ^ self._salt if wire else 0

    def _lease_out(self, lease: int) -> int:
        return lease ^ self._salt if lease else 0

    def _entry_json(self, e: Entry) -> dict[str, Any]:
        return {"key": e.key, "value": b64(e.value), "version": e.version,
                "mod_revision": e.mod_revision, "lease": self._lease_out(e.lease)}

    async def _put(self, q: _Body) -> dict[str, Any]:
        return {"revision": await self.backend.put(q.key(), q.value("value") or b"", lease=self._lease_in(q))}

    async def _get(self, q: _Body) -> dict[str, Any]:
        entry = await self.backend.get(q.key())
        return {"entry": None if entry is None else self._entry_json(entry)}

    async def _get_prefix(self, q: _Body) -> dict[str, Any]:
        entries = await self.backend.get_prefix(q.key("prefix", allow_empty=True))
        return {"entries": [self._entry_json(e) for e in entries]}

    async def _create(self, q: _Body) -> dict[str, Any]:
        created = await self.backend.create(q.key(), q.value("value") or b"", lease=self._lease_in(q))
        return {"created": created}

    async def _cas(self, q: _Body) -> dict[str, Any]:
        swapped = await self.backend.compare_and_swap(
            q.key(), q.value("value") or b"", expected_value=q.value("expected_value", required=False),
            expected_version=q.integer("expected_version"), lease=self._lease_in(q))
        return {"swapped": swapped}

    async def _cad(self, q: _Body) -> dict[str, Any]:
        deleted = await self.backend.compare_and_delete(
            q.key(), expected_value=q.value("expected_value", required=False),
            expected_version=q.integer("expected_version"))
        return {"deleted": deleted}

    async def _grant(self, q: _Body) -> dict[str, Any]:
        if "ttl_s" not in q.data:
            raise _HttpError(400, "bad_request", "missing field 'ttl_s'")
        return {"lease": self._lease_out(await self.backend.grant_lease(q.data["ttl_s"]))}

    async def _refresh(self, q: _Body) -> dict[str, Any]:
        await self.backend.refresh_lease(self._lease_in(q, required=True))
        return {}

    async def _lease_ttl(self, q: _Body) -> dict[str, Any]:
        lease = self._lease_in(q, required=True)
        found = await self.backend.lease_ttl(lease)
        if found is None:
            raise LeaseNotFound(f"lease {self._lease_out(lease):x} not found (expired or revoked)")
        return {"ttl_s": found[0], "left_s": found[1]}

    async def _watch(self, q: _Body) -> dict[str, Any]:
        prefix = q.key("prefix", allow_empty=True)
        after = q.integer("after")
        if after is None:  # start: pin the revision every later change comes after
            await self._log.ensure_started()
            return {"events": [], "revision": self._log.head(), "epoch": self._log.epoch}
        epoch = q.data.get("epoch")
        if not isinstance(epoch, str):
            raise _HttpError(400, "bad_request", "'epoch' (from the watch's start) must be a string")
        timeout_s = min(q.number("timeout_s", 10.0), MAX_POLL_S)
        events, revision = await self._log.poll(prefix, after, epoch, timeout_s)
        return {"events": [{"kind": e.kind, "key": e.key, "value": b64(e.value), "revision": e.revision}
                           for e in events],
                "revision": revision, "epoch": self._log.epoch}


async def _wrap(name: str, result: Awaitable[object]) -> dict[str, Any]:
    return {name: await result}


def _error(status: int, kind: str, message: str) -> Response:
    from starlette.responses import JSONResponse

    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"kind": kind, "message": message}}, status_code=status, headers=headers)


def registry_router(backend: RegistryBackend, token: str, *,
                    is_client_token: Callable[[str], bool] | None = None) -> APIRouter:
    """FastAPI routes serving ``backend`` under ``/v1/registry/`` (see :class:`RegistryServer`)."""
    return RegistryServer(backend, token, is_client_token=is_client_token).router


# -- standalone server: `python -m triplane.registry.http` (clusters without etcd) ----------


def main(argv: list[str] | None = None) -> int:
    """Serve a fresh in-memory registry; prints ``{"url": ...}`` on stdout once listening.

    The credential clients must present is ``--token-file``'s contents, else the node
    credential derived from ``--secret-file`` or ``$TRIPLANE_SECRET``. Exit code 2 on bad
    arguments (no credential, port in use).
    """
    import uvicorn
    from fastapi import FastAPI

    from triplane.net.http import guarded_config
    from triplane.registry.memory import MemoryBackend

    ap = argparse.ArgumentParser(prog="python -m triplane.registry.http", description=main.__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8470)
    ap.add_argument("--token-file", help="the exact credential clients must present")
    ap.add_argument("--secret-file", help="the cluster secret (the node credential is derived from it)")
    args = ap.parse_args(argv)
    token = ""
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip()
    elif args.secret_file:
        with open(args.secret_file, encoding="utf-8") as f:
            secret = f.read().strip()
        token = node_credential(secret) if secret else ""
    else:
        token = node_credential_from_env() or ""
    if not token:
        print("no credential: pass --secret-file or --token-file, or set TRIPLANE_SECRET", file=sys.stderr)
        return 2
    # Bind and listen before announcing, so a client that reads the URL can connect at once.
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so, and without
    # it every answer written in two parts waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    sock.listen(128)
    server_state = RegistryServer(MemoryBackend(), token)
    app = FastAPI(title="triplane registry")
    app.include_router(server_state.router)
    config = guarded_config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(json.dumps({"url": f"http://{host}:{sock.getsockname()[1]}"}), flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    return 0
