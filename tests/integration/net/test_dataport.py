"""The data port server and client over real loopback sockets (one process, bounded):
round trips, limits, and every way a peer without the secret can try to pass off data."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from triplane.engines.memory.host import HostMemoryEngine
from triplane.executor.dataport import EngineTiles
from triplane.net.dataport import DataClient, DataPortError, DataServer
from triplane.net.guard import Limits
from triplane.proto.dataport import CHUNK_TAG_BYTES, LENGTH, TAG_BYTES, encode_request, parse_response
from triplane.proto.packet import canonical

SECRET = b"dataport-loopback-secret"
HOST = "127.0.0.1"


def serve(test: Callable[[DataServer, DataClient, HostMemoryEngine], Awaitable[Any]],
          capacity: int = 64 << 20, limits: Limits | None = None, **client_kw: Any) -> Any:
    async def go() -> Any:
        store = HostMemoryEngine(capacity)
        server = DataServer(EngineTiles(store), SECRET, host=HOST, **({"limits": limits} if limits else {}))
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
        assert err.value.kind == "full" and not err.value.missing
        assert (await client.get(HOST, server.port, "a")).shape == (200,)
        assert server.stats["refused"] == 0 and store.used() == 800 and store.free() == 200

    serve(t, capacity=1000)


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers until it hangs up."""
    r, w = await asyncio.open_connection(HOST, port)
    w.write(data)
    await w.drain()
    answer = await asyncio.wait_for(r.read(), 5)
    w.close()
    return answer


def refusal_kind(answer: bytes) -> str | None:
    assert answer[4:4 + TAG_BYTES] == bytes(TAG_BYTES)  # a refusal: never authentic
    return parse_response(answer[4 + TAG_BYTES:]).kind


def test_wrong_secret_unsigned_and_garbage_are_refused_and_the_server_keeps_serving() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        store.put("x", np.ones(3, np.float32))
        stranger = DataClient(b"not-the-cluster-secret")
        with pytest.raises(DataPortError, match=r"not authenticated.*wrong cluster secret") as err:
            await stranger.get(HOST, server.port, "x")
        assert err.value.kind == "unauthenticated"  # the server's refusal is quoted, not trusted
        with pytest.raises(DataPortError, match="not authenticated"):  # put refused before its data
            await stranger.put(HOST, server.port, "y", np.ones(1 << 20, np.float32))
        await stranger.close()
        assert "y" not in store
        garbage = (LENGTH.pack(9) + bytes(TAG_BYTES) + b"not json!",
                   LENGTH.pack(2) + b"x" * TAG_BYTES + b"{}", LENGTH.pack(0), LENGTH.pack(1 << 30))
        for raw in garbage:
            answer = await raw_exchange(server.port, raw)
            if answer:
                assert refusal_kind(answer) == "unauthorized"
        assert server.stats["refused"] >= 3 and server.stats["errors"] == 0
        assert (await client.get(HOST, server.port, "x")).shape == (3,)

    serve(t)


def test_stale_and_replayed_requests_are_refused() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        store.put("x", np.ones(3, np.float32))
        stale, _ = encode_request("get", SECRET, now=time.time() - 31, tile="x")
        answer = await raw_exchange(server.port, stale)
        assert parse_response(answer[4 + TAG_BYTES:]).kind == "stale"
        fresh, _ = encode_request("get", SECRET, now=time.time(), tile="x")
        first = await raw_exchange_one(server.port, fresh)
        assert parse_response(first[4 + TAG_BYTES:]).ok
        replay = await raw_exchange(server.port, fresh)  # the same bytes again: refused
        assert parse_response(replay[4 + TAG_BYTES:]).kind == "replay"

    serve(t)


async def raw_exchange_one(port: int, data: bytes) -> bytes:
    """Send ``data``; the first response frame (header only)."""
    r, w = await asyncio.open_connection(HOST, port)
    w.write(data)
    (n,) = LENGTH.unpack(await r.readexactly(4))
    body = await r.readexactly(TAG_BYTES + n)
    w.close()
    return LENGTH.pack(n) + body


def test_dead_pooled_connection_is_retried_and_dead_peers_fail_clearly() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        store.put("x", np.ones(3, np.float32))
        await client.get(HOST, server.port, "x")
        port = server.port
        await server.close()  # drops the pooled connection's peer end
        server2 = DataServer(EngineTiles(store), SECRET, host=HOST, port=port)
        await server2.start()
        try:
            assert (await client.get(HOST, port, "x")).shape == (3,)  # retried on a fresh one
        finally:
            await server2.close()
        with pytest.raises(DataPortError, match="cannot connect"):
            await client.get(HOST, port, "x")

    serve(t)


def test_every_pooled_connection_closed_at_the_idle_timeout_is_replaced() -> None:
    # Two requests at once leave two pooled connections; the server closes both when idle.
    # The next request must not fail on the second dead one after retrying the first.
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        store.put("x", np.arange(5, dtype=np.float32))
        await asyncio.gather(client.get(HOST, server.port, "x"), client.get(HOST, server.port, "x"))
        assert len(client._idle[(HOST, server.port)]) == 2
        deadline = time.monotonic() + 10
        while server.guard.counts["idle_closed"] < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert server.guard.counts["idle_closed"] == 2
        got = await client.get(HOST, server.port, "x")
        np.testing.assert_array_equal(got, np.arange(5, dtype=np.float32))

    serve(t, limits=Limits(idle_timeout=0.3))


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


# --- impostors: a poisoned address must make the pull fail, never yield data ----------------


async def fake_server(answer: Callable[[bytes], bytes]) -> tuple[asyncio.base_events.Server, int]:
    """A server that reads one request frame and sends ``answer(request)``."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            (n,) = LENGTH.unpack(await r.readexactly(4))
            request = await r.readexactly(TAG_BYTES + n)
            w.write(answer(request))
            await w.drain()
            await asyncio.sleep(0.5)
        w.close()

    srv = await asyncio.start_server(handle, HOST, 0)
    return srv, srv.sockets[0].getsockname()[1]


def plausible_tile(tag: bytes = bytes(TAG_BYTES)) -> bytes:
    """What a stranger without the secret would answer to a get: a float32[4] of 8s."""
    header = canonical({"v": 1, "ok": True, "shape": [4], "dtype": "float32", "bytes": 16})
    data = np.full(4, 8, np.float32).tobytes()
    return LENGTH.pack(len(header)) + tag + header + data + bytes(CHUNK_TAG_BYTES)


async def flip_one_byte(r: asyncio.StreamReader, w: asyncio.StreamWriter, real_port: int) -> None:
    """Relay one request to the real server and its answer back, with the first data byte
    flipped (the answer is a float32[4] tile: header, 16 bytes, one chunk tag)."""
    with contextlib.suppress(Exception):
        (n,) = LENGTH.unpack(await r.readexactly(4))
        request = LENGTH.pack(n) + await r.readexactly(TAG_BYTES + n)
        rr, rw = await asyncio.open_connection(HOST, real_port)
        rw.write(request)
        (m,) = LENGTH.unpack(await rr.readexactly(4))
        answer = bytearray(LENGTH.pack(m) + await rr.readexactly(TAG_BYTES + m + 16 + CHUNK_TAG_BYTES))
        rw.close()
        answer[4 + TAG_BYTES + m] ^= 0x01
        w.write(bytes(answer))
        await w.drain()
        await asyncio.sleep(0.5)
    w.close()


@pytest.mark.parametrize("how", ["no secret", "wrong secret", "replayed response", "altered chunk"])
def test_an_impostor_data_port_makes_the_pull_fail_clearly(how: str) -> None:
    async def go() -> None:
        client = DataClient(SECRET, io_timeout=5.0)
        store = HostMemoryEngine(1 << 20)
        store.put("x", np.arange(4, dtype=np.float32))
        real = DataServer(EngineTiles(store), SECRET, host=HOST)
        await real.start()
        servers: list[Any] = []
        try:
            if how == "no secret":
                srv, port = await fake_server(lambda req: plausible_tile(b"\x01" * TAG_BYTES))
                servers.append(srv)
            elif how == "wrong secret":
                other = DataServer(EngineTiles(store), b"some-other-cluster-secret", host=HOST)
                port = await other.start()
                servers.append(other)
            elif how == "replayed response":
                # Record a genuine answer (tags and all) to one request, replay it to the next.
                frame, _ = encode_request("get", SECRET, now=time.time(), tile="x")
                recorded = await raw_exchange(real.port, frame + LENGTH.pack(0))
                srv, port = await fake_server(lambda req: recorded)
                servers.append(srv)
            else:  # a man in the middle flips one data byte of the genuine answer
                srv = await asyncio.start_server(lambda r, w: flip_one_byte(r, w, real.port), HOST, 0)
                servers.append(srv)
                port = srv.sockets[0].getsockname()[1]
            with pytest.raises(DataPortError) as err:
                await client.get(HOST, port, "x")
            assert err.value.kind == "unauthenticated"
            assert "secret" in str(err.value) or "forged" in str(err.value)
            with pytest.raises(DataPortError) as err:  # the scheduler's streaming fetch, too
                *_, chunks = await client.open_tile(HOST, port, "x")
                async for _ in chunks:
                    pass
            assert err.value.kind == "unauthenticated"
            assert (await client.get(HOST, real.port, "x")).tolist() == [0, 1, 2, 3]
        finally:
            for s in servers:
                closed = s.close()
                if closed is not None:
                    await closed
            await client.close()
            await real.close()

    asyncio.run(asyncio.wait_for(go(), 60))


# --- limits -------------------------------------------------------------------------------------


def test_half_open_connections_are_closed_within_the_idle_timeout() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        r, w = await asyncio.open_connection(HOST, server.port)
        w.write(b"\x00\x00")  # two header bytes, then nothing
        await w.drain()
        t0 = time.monotonic()
        assert await asyncio.wait_for(r.read(), 5) == b""  # closed by the server
        assert time.monotonic() - t0 < 1.5
        assert server.guard.counts["idle_closed"] == 1 and server.guard.open == 0
        w.close()

    serve(t, limits=Limits(idle_timeout=0.5))


def test_the_connection_cap_is_enforced_and_frees_up() -> None:
    async def t(server: DataServer, client: DataClient, store: HostMemoryEngine) -> None:
        store.put("x", np.ones(3, np.float32))
        held = [await asyncio.open_connection(HOST, server.port) for _ in range(4)]
        await asyncio.sleep(0.2)
        assert server.guard.open == 4
        r, _ = await asyncio.open_connection(HOST, server.port)  # one over the cap
        assert await asyncio.wait_for(r.read(), 5) == b""
        assert server.guard.counts["refused"] >= 1
        for _, hw in held:
            hw.close()
        await asyncio.sleep(0.2)
        assert (await client.get(HOST, server.port, "x")).shape == (3,)

    serve(t, limits=Limits(max_connections=4))
