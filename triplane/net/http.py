"""Guarded HTTP serving for the scheduler's API and the served registry (uvicorn, h11).

uvicorn closes a connection idle *between* requests (``timeout_keep_alive``) but not one
that sent part of a request's head and then nothing (two bytes of ``GET`` hold a socket and
a slot for as long as the peer likes). :class:`GuardedH11Protocol` adds the missing
bound: a request's head (request line and headers) must be complete within
``head_timeout_s`` of the connection opening or of the previous response ending, or the
connection is closed; and a connection beyond ``max_connections`` is closed as soon as it
is accepted. A request whose head has arrived is not timed here: long polls (``/wait``,
registry watches) and streamed bodies are bounded by their routes.

``guarded_config(app, ...)`` is the ``uvicorn.Config`` both servers use.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEAD_TIMEOUT_S", "MAX_CONNECTIONS", "GuardedH11Protocol", "guarded_config"]

HEAD_TIMEOUT_S = 10.0  # a request's line and headers arrive within this, or the connection closes
MAX_CONNECTIONS = 512  # open connections at once; more are closed on accept
KEEP_ALIVE_S = 5.0  # idle between requests (uvicorn's own timer)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head and a connection cap
    (class attributes, set per server by :func:`guarded_config`)."""

    head_timeout_s = HEAD_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
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
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request's head arrived: it is being served
        self.transport.close()


def guarded_config(app: Any, *, head_timeout_s: float = HEAD_TIMEOUT_S,
                   max_connections: int = MAX_CONNECTIONS, **options: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` with :class:`GuardedH11Protocol` bounds (and
    uvicorn's keep-alive timeout and in-flight request limit); ``options`` go to uvicorn."""
    protocol = type("GuardedH11", (GuardedH11Protocol,),
                    {"head_timeout_s": head_timeout_s, "max_connections": max_connections})
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    options.setdefault("limit_concurrency", max_connections)
    return uvicorn.Config(app, http=protocol, **options)
