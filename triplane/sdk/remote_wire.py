"""The job submits' own HTTP/1.1 connections: ``http.client`` with keep-alive, beside the
session's ``httpx.Client``.

A compiled step is one ``POST /v1/jobs`` a few milliseconds long, so the client's own cost
per request counts: httpx goes through its client layer, then httpcore and h11 (all
Python), where ``http.client`` does much less (docs/runtime.md "Compiled steps").
:class:`Wire` sends ``POST /v1/jobs`` only; every other request stays on httpx. It keeps
a few idle connections (one per thread that submits at once), drops one the scheduler
closed while it was idle (it is readable before it is used), and behaves as
``remote_errors.request`` does: a refused connection or a 503 is retried for up to
``reconnect_s``; a request that may have arrived is never sent twice.

:func:`wire_for` gives none (the session stays on httpx) for an ``https`` scheduler, a
test's own transport, or a URL that the environment sends through a proxy.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from triplane.sdk.remote_errors import Unreachable, with_retries

__all__ = ["Answer", "Wire", "wire_for"]

IDLE_KEPT = 4  # idle connections kept for reuse (one per thread submitting at once)


class Answer:
    """A response of :class:`Wire` (the part of ``httpx.Response`` the session and
    ``remote_errors.http_error`` read)."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status: int, headers: list[tuple[str, str]], content: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def wire_for(url: str, headers: Mapping[str, str], connect_s: float, timeout_s: float,
             transport: Any = None) -> Wire | None:
    """A :class:`Wire` to the scheduler at ``url``, or None where httpx must carry the
    submits (the module doc)."""
    if transport is not None:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    if urllib.request.getproxies().get("http") and not urllib.request.proxy_bypass(parts.hostname):
        return None
    return Wire(parts.hostname, parts.port or 80, parts.path.rstrip("/"), dict(headers), connect_s,
                timeout_s)


class Wire:
    """``POST`` to one scheduler over kept-alive ``http.client`` connections."""

    def __init__(self, host: str, port: int, base: str, headers: dict[str, str], connect_s: float,
                 timeout_s: float) -> None:
        self.host, self.port, self.base = host, port, base
        self.url = f"http://{host}:{port}{base}"
        self.headers = headers
        self.connect_s, self.timeout_s = connect_s, timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def post(self, path: str, content: bytes, headers: Mapping[str, str], reconnect_s: float,
             timeout_s: float | None = None) -> Answer:
        """``POST path`` with ``content``, retried as ``remote_errors.with_retries`` says (a
        refused connection and 503 only); the answer, ``http_error`` of one of 400 or more,
        or a RemoteError saying the scheduler cannot be reached."""
        sent = {**self.headers, **headers}
        timeout = timeout_s or self.timeout_s
        answer: Answer = with_retries(lambda: self._try(path, content, sent, timeout), self.url,
                                      f"POST {path}", reconnect_s)
        return answer

    def _try(self, path: str, content: bytes, headers: dict[str, str], timeout_s: float) -> Answer:
        """One try; :class:`Unreachable` when it got no answer (retriable when the connection
        was refused: nothing was sent)."""
        try:
            conn = self._take()
        except OSError as e:
            raise Unreachable(f"{type(e).__name__}: {e}", retriable=True) from None
        try:
            conn.sock.settimeout(timeout_s)
            conn.request("POST", self.base + path, body=content, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            answer = Answer(resp.status, resp.getheaders(), body)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise Unreachable(f"{type(e).__name__}: {e}", retriable=False) from None
        except BaseException:  # Ctrl-C mid-request: the connection is in an unknown state
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return answer

    def _take(self) -> http.client.HTTPConnection:
        """An idle connection the scheduler has not closed, else a new one (OSError when
        refused)."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if not readable:  # (readable while idle: closed by the scheduler, or garbage)
                return conn
            conn.close()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_s)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < IDLE_KEPT:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
