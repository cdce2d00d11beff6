"""The data port server and client over real loopback sockets (one process, bounded)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from triplane.engines.memory.host import HostMemoryEngine
from triplane.executor.dataport import DataClient, DataPortError, DataServer
from triplane.executor.datawire import HEADER, make_request, parse_response

SECRET = b"dataport-loopback-secret"
HOST = "127.0.0.1"


def serve(test: Callable[[DataServer, DataClient, HostMemoryEngine], Awaitable[Any]],
          capacity: int = 64 << 20, **client_kw: Any) -> Any:
    async def go() -> Any:
        store = HostMemoryEngine(capacity)
        server = DataServer(store, SECRET, host=HOST)
        await server.start()
        client = DataClient(SECRET, **client_kw)
        try:
            return await test(server, client, store)
        finally:
            await client.close()
            await server.close()

    return asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool", "uint8", "bfloat16"])
def test_put_get_stat_delete_round_trip(dtype: str) -> None:
    from triplane.proto import dtypes as dt

    x = (np.arange(24).reshape(2, 3, 4) % 2).astype(dt.BY_NAME[dtype].np)

    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        await client.put(HOST, server.port, "u-1", x)
        assert store.used() == x.nbytes
        got = await client.get(HOST, server.port, "u-1")
        assert got.dtype == x.dtype and got.shape == x.shape and got.tobytes() == x.tobytes()
        got[...] = 0  # the caller owns its copy
        st = await client.stat(HOST, server.port, "u-1")
        assert (st.shape, st.dtype, st.bytes) == ((2, 3, 4), dtype, x.nbytes)
        await client.delete(HOST, server.port, ["u-1", "never-there"])
        with pytest.raises(DataPortError, match="no such tile: u-1") as err:
            await client.get(HOST, server.port, "u-1")
        assert err.value.missing and store.used() == 0

    serve(t)


def test_zero_d_and_empty_tiles() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        await client.put(HOST, server.port, "s", np.float64(2.5))
        await client.put(HOST, server.port, "e", np.zeros((0, 3), np.int32))
        assert (await client.get(HOST, server.port, "s")).shape == ()
        assert float(await client.get(HOST, server.port, "s")) == 2.5
        assert (await client.get(HOST, server.port, "e")).shape == (0, 3)

    serve(t)


def test_large_tile_streams_and_connections_are_pooled(capsys: pytest.CaptureFixture[str]) -> None:
    big = np.random.default_rng(0).standard_normal(32 << 20, dtype=np.float32)  # 128 MiB

    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> dict[str, float]:
        t0 = time.perf_counter()
        await client.put(HOST, server.port, "big", big)
        t1 = time.perf_counter()
        got = await client.get(HOST, server.port, "big")
        t2 = time.perf_counter()
        assert np.array_equal(got, big)
        assert len(client._idle[(HOST, server.port)]) == 1  # one connection, reused
        assert server.stats["bytes_in"] == server.stats["bytes_out"] == big.nbytes
        return {"put": big.nbytes / (t1 - t0) / 1e9, "get": big.nbytes / (t2 - t1) / 1e9}

    rates = serve(t, capacity=256 << 20)
    with capsys.disabled():
        print(f"\n  data port, 128 MiB tile on loopback: put {rates['put']:.2f} GB/s, "
              f"get {rates['get']:.2f} GB/s")


def test_memory_full_put_is_drained_and_the_connection_stays_usable() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        await client.put(HOST, server.port, "a", np.zeros(200, np.float32))
        with pytest.raises(DataPortError, match="memory full") as err:
            await client.put(HOST, server.port, "b", np.zeros(300, np.float32))
        assert not err.value.missing
        assert (await client.get(HOST, server.port, "a")).shape == (200,)
        assert server.stats["refused"] == 0 and store.used() == 800 and store.free() == 200

    serve(t, capacity=1000)


def test_wrong_secret_unsigned_and_garbage_are_refused_and_the_server_keeps_serving() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        store.put("x", np.ones(3, np.float32))
        stranger = DataClient(b"not-the-cluster-secret")
        with pytest.raises(DataPortError, match="bad signature"):
            await stranger.get(HOST, server.port, "x")
        with pytest.raises(DataPortError, match="unauthorized"):  # put refused before its data
            await stranger.put(HOST, server.port, "y", np.ones(1 << 20, np.float32))
        await stranger.close()
        assert "y" not in store
        garbage = (HEADER.pack(9) + b"not json!", HEADER.pack(2) + b"{}", HEADER.pack(0),
                   HEADER.pack(1 << 30))
        for raw in garbage:
            r, w = await asyncio.open_connection(HOST, server.port)
            w.write(raw)
            await w.drain()
            answer = await asyncio.wait_for(r.read(), 5)  # then the server hangs up
            w.close()
            if answer:
                assert not parse_response(answer[4:]).ok
        stale = make_request("get", SECRET, tile="x", now=time.time() - 31)
        r, w = await asyncio.open_connection(HOST, server.port)
        w.write(stale)
        answer = await asyncio.wait_for(r.read(), 5)
        w.close()
        assert "stale" in (parse_response(answer[4:]).error or "")
        assert server.stats["refused"] >= 5
        assert (await client.get(HOST, server.port, "x")).shape == (3,)

    serve(t)


def test_dead_pooled_connection_is_retried_and_dead_peers_fail_clearly() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        store.put("x", np.ones(3, np.float32))
        await client.get(HOST, server.port, "x")
        port = server.port
        await server.close()  # drops the pooled connection's peer end
        server2 = DataServer(store, SECRET, host=HOST, port=port)
        await server2.start()
        try:
            assert (await client.get(HOST, port, "x")).shape == (3,)  # retried on a fresh one
        finally:
            await server2.close()
        with pytest.raises(DataPortError, match="cannot connect"):
            await client.get(HOST, port, "x")

    serve(t)


def test_a_silent_peer_times_out() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        silent = socket.socket()
        silent.bind((HOST, 0))
        silent.listen(1)  # accepts (in the kernel backlog) but never answers
        try:
            with pytest.raises(DataPortError, match="timed out"):
                await client.get(HOST, silent.getsockname()[1], "x")
        finally:
            silent.close()

    serve(t, io_timeout=0.5)
