"""Guarded HTTP serving for the scheduler's API and the served registry (uvicorn).

uvicorn closes a connection idle *between* requests (``timeout_keep_alive``) but not one
that sent part of a request's head and then nothing (two bytes of ``GET`` hold a socket and
a slot for as long as the peer likes). :class:`HeadGuard` adds the missing bound to
uvicorn's protocols: a request's head (request line and headers) must be complete within
``head_timeout_s`` of the connection opening or of the previous response ending, or the
connection is closed; and a connection beyond ``max_connections`` is closed as soon as it
is accepted. A request whose head has arrived is not timed here: long polls (``/wait``,
registry watches) and streamed bodies are bounded by their routes.

Two protocols carry the guard: :class:`GuardedHttpToolsProtocol` (uvicorn's httptools
parser, a C extension: about a third of the CPU per request of the pure-Python h11 one,
which was a fifth of the scheduler's per-step time on a compiled training step, bench/README.md)
when ``httptools`` is importable, else :class:`GuardedH11Protocol`. Both close a
connection on a malformed request the same way (400, then close).

``guarded_config(app, ...)`` is the ``uvicorn.Config`` both servers use.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: h11 only
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

__all__ = ["HEAD_TIMEOUT_S", "MAX_CONNECTIONS", "GuardedH11Protocol", "GuardedHttpToolsProtocol",
           "HeadGuard", "guarded_config"]

HEAD_TIMEOUT_S = 10.0  # a request's line and headers arrive within this, or the connection closes
MAX_CONNECTIONS = 512  # open connections at once; more are closed on accept
KEEP_ALIVE_S = 5.0  # idle between requests (uvicorn's own timer)


class HeadGuard:
    """A deadline on each request's head and a connection cap, mixed into a uvicorn HTTP
    protocol (class attributes, set per server by :func:`guarded_config`). It relies on
    what both of uvicorn's protocols have: ``connections``, ``loop``, ``transport`` and
    ``cycle`` (the request being served; None or complete between requests)."""

    head_timeout_s = HEAD_TIMEOUT_S
    max_connections = MAX_CONNECTIONS
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._head_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._arm()  # the next request's head is timed from here

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:
            return  # a request's head arrived: it is being served
        self.transport.close()


class GuardedH11Protocol(HeadGuard, H11Protocol):
    """uvicorn's h11 protocol with the :class:`HeadGuard` bounds."""


if HttpToolsProtocol is not None:
    class GuardedHttpToolsProtocol(HeadGuard, HttpToolsProtocol):
        """uvicorn's httptools protocol with the :class:`HeadGuard` bounds."""
else:
    GuardedHttpToolsProtocol = None  # type: ignore[assignment,misc]


def guarded_config(app: Any, *, head_timeout_s: float = HEAD_TIMEOUT_S,
                   max_connections: int = MAX_CONNECTIONS, parser: str = "auto",
                   **options: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` with :class:`HeadGuard` bounds (and uvicorn's
    keep-alive timeout and in-flight request limit); ``options`` go to uvicorn. ``parser``:
    ``"httptools"``, ``"h11"`` or ``"auto"`` (httptools when installed)."""
    if parser not in ("auto", "httptools", "h11"):
        raise ValueError(f"unknown HTTP parser {parser!r} (known: auto, httptools, h11)")
    if parser == "httptools" and GuardedHttpToolsProtocol is None:
        raise ValueError("the httptools parser is not installed (pip install httptools)")
    base = GuardedH11Protocol if parser == "h11" or GuardedHttpToolsProtocol is None \
        else GuardedHttpToolsProtocol
    protocol = type(f"Guarded{base.__name__}", (base,),
                    {"head_timeout_s": head_timeout_s, "max_connections": max_connections})
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    options.setdefault("limit_concurrency", max_connections)
    return uvicorn.Config(app, http=protocol, **options)
