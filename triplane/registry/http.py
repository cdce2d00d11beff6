"""The registry served over HTTP (client side): :class:`HttpBackend` for ``http(s)://`` URLs.

A scheduler running ``--registry memory://`` serves its registry under ``/v1/registry/``
(:mod:`triplane.registry.http_server`, which documents the wire protocol). Executors in
other processes reach it with ``connect_registry("http://host:port", secret=...)`` (the node
credential, derived from the cluster secret) and
get the same :class:`RegistryBackend` contract, checked by the same conformance suite,
so they cannot tell it from etcd. ``python -m triplane.registry.http`` runs a standalone
registry server (see :func:`triplane.registry.http_server.main`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import socket
import sys
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httpx

from triplane.registry.backend import (
    Entry,
    LeaseNotFound,
    RegistryBackend,
    RegistryError,
    RegistryUnavailable,
    Watch,
    WatchEvent,
    check_key,
    check_ttl,
    check_value,
)
from triplane.registry.http_server import (
    API_PREFIX,
    MAX_LEASE_ID,
    MAX_POLL_S,
    RegistryServer,
    b64,
    main,
    registry_router,
)

__all__ = ["HttpBackend", "RegistryAuthError", "RegistryServer", "main", "registry_router"]

log = logging.getLogger(__name__)


class RegistryAuthError(RegistryError, PermissionError):
    """The served registry refused the credential: wrong or missing (HTTP 401), or a client
    token where the node credential is needed (HTTP 403)."""


class _HistoryLost(RegistryUnavailable):
    """The server can no longer replay a watch from its revision: re-list (HTTP 410)."""


class _HttpWatch(Watch):
    def __init__(self, backend: HttpBackend, abs_prefix: str) -> None:
        self.backend = backend
        self.abs_prefix = abs_prefix
        self._after: int | None = None
        self._epoch = ""
        self._buffer: deque[WatchEvent] = deque()
        self._cancelled = False
        self._poll: asyncio.Future[None] | None = None

    async def start(self) -> None:
        if self._after is None and not self._cancelled:
            data = await self.backend._call("watch", {"prefix": self.abs_prefix})
            with _malformed():
                self._after, self._epoch = int(data["revision"]), str(data["epoch"])

    async def next_event(self) -> WatchEvent | None:
        if self._after is None:
            await self.start()
        while not self._cancelled:
            if self._buffer:
                return self._buffer.popleft()
            self._poll = asyncio.ensure_future(self._fetch())
            try:
                await self._poll
            except asyncio.CancelledError:
                if self._cancelled:
                    return None
                raise
            finally:
                self._poll = None
        return None

    async def _fetch(self) -> None:
        """One long poll; transient failures are retried (resuming from the same revision)
        for up to 3 x the backend's timeout, then :class:`RegistryUnavailable`."""
        b = self.backend
        give_up: float | None = None
        while True:
            body = {"prefix": self.abs_prefix, "after": self._after, "epoch": self._epoch,
                    "timeout_s": b.poll_s}
            try:
                data = await b._call("watch", body, timeout=b.poll_s + b.timeout_s)
                break
            except _HistoryLost:
                raise
            except RegistryUnavailable as exc:
                now = asyncio.get_running_loop().time()
                if give_up is None:
                    give_up = now + 3 * b.timeout_s
                    log.warning("registry watch on %r broke (%s); resuming from revision %s",
                                self.abs_prefix, exc, self._after)
                if now > give_up:
                    raise
                await asyncio.sleep(0.2)
        strip = len(b.prefix)
        with _malformed():
            for ev in data["events"]:
                kind = ev["kind"]
                if kind not in ("put", "delete"):
                    raise ValueError(f"unknown event kind {kind!r}")
                self._buffer.append(WatchEvent(kind, ev["key"][strip:], base64.b64decode(ev["value"]),
                                               int(ev["revision"])))
            self._after = int(data["revision"])

    async def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self.backend._watches.discard(self)
            if self._poll is not None:
                self._poll.cancel()


@contextlib.contextmanager
def _malformed() -> Any:
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
        raise RegistryError(f"malformed answer from the registry server: {exc!r}") from exc


class HttpBackend(RegistryBackend):
    """A :class:`RegistryBackend` on a registry served over HTTP (``http://host:port``).

    ``token`` is the node credential (``triplane.registry.credential``; client tokens are
    refused). ``prefix`` (default ``""``) namespaces keys
    inside the served registry, whose own prefix already applies. Every call raises
    :class:`RegistryUnavailable` when the server cannot be reached or times out after
    ``timeout_s`` (the operation may or may not have applied), :class:`RegistryAuthError`
    on a refused token. Watches long-poll for ``poll_s`` per request and ride out
    outages up to ``3 x timeout_s``; a server that lost its history (restarted) makes
    them raise :class:`RegistryUnavailable` so the caller re-lists. ``transport`` is
    passed to ``httpx.AsyncClient`` (tests use ``httpx.ASGITransport``).
    """

    def __init__(self, url: str, token: str, *, prefix: str = "", timeout_s: float = 5.0,
                 poll_s: float = 10.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError(f"registry URL must look like http://HOST:PORT, got {url!r}")
        if not isinstance(token, str) or not token:
            raise ValueError("the http registry needs the node credential: pass token= (or secret=), "
                             "or set TRIPLANE_SECRET")
        self.url = url.rstrip("/")
        self.prefix = check_key(prefix, allow_empty=True)
        self.timeout_s = check_ttl(timeout_s)
        self.poll_s = min(check_ttl(poll_s), MAX_POLL_S)
        self._token = token
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watches: set[_HttpWatch] = set()

    def _http(self) -> httpx.AsyncClient:
        # A connection pool belongs to one event loop; a backend reused under a new
        # asyncio.run gets a fresh client instead of the dead loop's sockets.
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._loop = loop
            # TCP_NODELAY: httpcore writes a POST's headers and body separately; Nagle would
            # hold the body until the server's delayed ACK of the headers (up to ~40 ms).
            transport = self._transport or httpx.AsyncHTTPTransport(
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
            self._client = httpx.AsyncClient(
                base_url=self.url + API_PREFIX + "/", transport=transport,
                headers={"Authorization": f"Bearer {self._token}"}, timeout=self.timeout_s)
        return self._client

    async def _call(self, path: str, body: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        try:
            resp = await self._http().post(path, json=body, timeout=timeout or self.timeout_s)
        except httpx.TransportError as exc:
            raise RegistryUnavailable(f"registry at {self.url} unreachable: {exc!r}") from exc
        if resp.status_code == 200:
            with _malformed():
                data = resp.json()
                if not isinstance(data, dict):
                    raise TypeError("not a JSON object")
                return data
        try:
            message = str(resp.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = resp.text[:200]
        where = f"registry at {self.url}: {message} (HTTP {resp.status_code})"
        if resp.status_code in (401, 403):
            raise RegistryAuthError(where)
        if resp.status_code == 404:
            raise LeaseNotFound(message)
        if resp.status_code == 410:
            raise _HistoryLost(where)
        if resp.status_code in (502, 503, 504):
            raise RegistryUnavailable(where)
        raise RegistryError(where)

    def _k(self, key: str, *, allow_empty: bool = False) -> str:
        return self.prefix + check_key(key, allow_empty=allow_empty)

    def _entry(self, e: dict[str, Any]) -> Entry:
        with _malformed():
            return Entry(e["key"][len(self.prefix):], base64.b64decode(e["value"]), int(e["version"]),
                         int(e["mod_revision"]), int(e["lease"]))

    @staticmethod
    def _with(body: dict[str, Any], lease: int | None = None, expected_value: bytes | None = None,
              expected_version: int | None = None) -> dict[str, Any]:
        """``body`` plus the optional fields, checked before anything is sent."""
        for name, n in (("lease", lease), ("expected_version", expected_version)):
            if n is None:
                continue
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{name} must be an int, got {type(n).__name__}")
            if not 0 <= n <= MAX_LEASE_ID:
                raise ValueError(f"{name} must be in [0, 2**63), got {n}")
            body[name] = n
        if expected_value is not None:
            body["expected_value"] = b64(check_value(expected_value))
        return body

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        body = self._with({"key": self._k(key), "value": b64(check_value(value))}, lease)
        with _malformed():
            return int((await self._call("put", body))["revision"])

    async def get(self, key: str) -> Entry | None:
        got = (await self._call("get", {"key": self._k(key)})).get("entry")
        return None if got is None else self._entry(got)

    async def get_prefix(self, prefix: str) -> list[Entry]:
        data = await self._call("get_prefix", {"prefix": self._k(prefix, allow_empty=True)})
        with _malformed():
            return [self._entry(e) for e in data["entries"]]

    async def delete(self, key: str) -> bool:
        return bool((await self._call("delete", {"key": self._k(key)})).get("deleted"))

    async def delete_prefix(self, prefix: str) -> int:
        data = await self._call("delete_prefix", {"prefix": self._k(prefix, allow_empty=True)})
        with _malformed():
            return int(data["deleted"])

    async def create(self, key: str, value: bytes, lease: int | None = None) -> bool:
        body = self._with({"key": self._k(key), "value": b64(check_value(value))}, lease)
        return bool((await self._call("create", body)).get("created"))

    async def compare_and_swap(self, key: str, value: bytes, *, expected_value: bytes | None = None,
                               expected_version: int | None = None,
                               lease: int | None = None) -> bool:
        if expected_value is None and expected_version is None:
            raise ValueError("compare-and-swap needs expected_value and/or expected_version")
        body = self._with({"key": self._k(key), "value": b64(check_value(value))}, lease,
                          expected_value, expected_version)
        return bool((await self._call("compare_and_swap", body)).get("swapped"))

    async def compare_and_delete(self, key: str, *, expected_value: bytes | None = None,
                                 expected_version: int | None = None) -> bool:
        if expected_value is None and expected_version is None:
            raise ValueError("compare-and-swap needs expected_value and/or expected_version")
        body = self._with({"key": self._k(key)}, None, expected_value, expected_version)
        return bool((await self._call("compare_and_delete", body)).get("deleted"))

    async def grant_lease(self, ttl_s: float) -> int:
        data = await self._call("lease/grant", {"ttl_s": check_ttl(ttl_s)})
        with _malformed():
            return int(data["lease"])

    async def refresh_lease(self, lease: int) -> None:
        await self._call("lease/refresh", self._with({}, lease))

    async def lease_ttl(self, lease: int) -> tuple[float, float] | None:
        try:
            data = await self._call("lease/ttl", self._with({}, lease))
        except LeaseNotFound:
            return None
        with _malformed():
            return float(data["ttl_s"]), float(data["left_s"])

    async def revoke_lease(self, lease: int) -> bool:
        return bool((await self._call("lease/revoke", self._with({}, lease))).get("revoked"))

    def watch_prefix(self, prefix: str) -> Watch:
        watch = _HttpWatch(self, self._k(prefix, allow_empty=True))
        self._watches.add(watch)
        return watch

    async def close(self) -> None:
        for watch in list(self._watches):
            await watch.cancel()
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                await client.aclose()


if __name__ == "__main__":
    sys.exit(main())
