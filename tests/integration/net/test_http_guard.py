"""The guarded HTTP serving of the scheduler's API and the served registry
(``triplane.net.http``): a request's head must arrive in time, connections are capped, and
what is well-formed is served as before -- against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest
from fastapi import FastAPI

from triplane.net.http import GuardedH11Protocol, GuardedHttpToolsProtocol, guarded_config

HOST = "127.0.0.1"
# both protocols carry the guard (httptools is in the [cluster] extra; h11 is the fallback)
PARSERS = ["h11", pytest.param("httptools", marks=pytest.mark.skipif(
    GuardedHttpToolsProtocol is None, reason="httptools is not installed"))]


def app() -> FastAPI:
    a = FastAPI()

    @a.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    @a.get("/slow")
    async def slow() -> dict[str, bool]:
        await asyncio.sleep(1.5)  # a long poll: longer than the head timeout, and served
        return {"ok": True}

    return a


async def serve(parser: str, head_timeout_s: float, max_connections: int = 64):  # type: ignore[no-untyped-def]
    import uvicorn

    sock = socket.socket()
    sock.bind((HOST, 0))
    config = guarded_config(app(), head_timeout_s=head_timeout_s, max_connections=max_connections,
                            parser=parser, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, sock.getsockname()[1]


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """Seconds until the server closes the connection (read() returns b"")."""
    started = time.monotonic()
    while True:
        data = await asyncio.wait_for(reader.read(4096), seconds)
        if not data:
            return time.monotonic() - started


@pytest.mark.parametrize("parser", PARSERS)
def test_a_half_open_request_is_closed_after_the_head_timeout_and_others_are_served(parser: str) -> None:
    async def go() -> None:
        server, task, port = await serve(parser, head_timeout_s=0.5)
        try:
            r, w = await asyncio.open_connection(HOST, port)
            w.write(b"GE")  # two bytes of a request line, then nothing
            await w.drain()
            took = await closed_within(r, 5.0)
            assert 0.4 <= took < 2.0, took
            async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}") as c:
                assert (await c.get("/ping")).json() == {"ok": True}
                # a request whose head arrived is not timed: a long poll is answered
                assert (await c.get("/slow")).json() == {"ok": True}
        finally:
            server.should_exit = True
            await task

    asyncio.run(go())


@pytest.mark.parametrize("parser", PARSERS)
def test_a_kept_alive_connection_gets_a_new_head_deadline_after_each_response(parser: str) -> None:
    async def go() -> None:
        server, task, port = await serve(parser, head_timeout_s=0.5)
        try:
            r, w = await asyncio.open_connection(HOST, port)
            w.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            await w.drain()
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            await asyncio.wait_for(r.readexactly(length), 5)
            w.write(b"GET /pi")  # the next request's head, unfinished
            await w.drain()
            took = await closed_within(r, 5.0)
            assert took < 2.0, took
        finally:
            server.should_exit = True
            await task

    asyncio.run(go())


@pytest.mark.parametrize("parser", PARSERS)
def test_connections_beyond_the_cap_are_closed_at_once(parser: str) -> None:
    async def go() -> None:
        server, task, port = await serve(parser, head_timeout_s=30.0, max_connections=4)
        held = []
        try:
            for _ in range(4):
                held.append(await asyncio.open_connection(HOST, port))
            await asyncio.sleep(0.2)
            r, _ = await asyncio.open_connection(HOST, port)
            took = await closed_within(r, 5.0)
            assert took < 1.0, took
            for _, hw in held:
                hw.close()
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}") as c:
                assert (await c.get("/ping")).status_code == 200  # room again once they left
        finally:
            server.should_exit = True
            await task

    asyncio.run(go())


def test_auto_takes_httptools_when_installed_and_an_unknown_parser_is_refused() -> None:
    config = guarded_config(app(), parser="auto")
    assert issubclass(config.http, GuardedHttpToolsProtocol or GuardedH11Protocol)  # type: ignore[arg-type]
    assert issubclass(guarded_config(app(), parser="h11").http, GuardedH11Protocol)
    with pytest.raises(ValueError, match="known: auto, httptools, h11"):
        guarded_config(app(), parser="picohttp")
