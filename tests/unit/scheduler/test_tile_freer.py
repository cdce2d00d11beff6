"""TileFreer: intermediate tiles deleted in one request per node, off the reply path."""

from __future__ import annotations

import asyncio

from triplane.scheduler.freeing import TileFreer


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, list[str]]] = []

    async def delete(self, addr: str, port: int, tiles: list[str]) -> None:
        self.calls.append((addr, port, list(tiles)))


def where(node: str) -> tuple[str, int] | None:
    return {"n1": ("h1", 1), "n2": ("h2", 2)}.get(node)


def test_tiles_go_in_one_request_per_node_and_a_resent_tile_stays() -> None:
    async def run() -> FakeClient:
        client = FakeClient()
        f = TileFreer(client, where, interval_s=0.01)  # type: ignore[arg-type]
        for i in range(5):
            f.free("n1", f"j.t{i}")
        f.free("n2", "j.u")
        f.free("gone", "j.v")  # a node no longer known: nothing to send
        f.sending("n1", "j.t3")  # recomputed there before the flush: keep it
        await asyncio.sleep(0.1)
        await f.close()
        assert f.freed == 5
        return client

    client = asyncio.run(run())
    assert sorted(client.calls) == [("h1", 1, ["j.t0", "j.t1", "j.t2", "j.t4"]), ("h2", 2, ["j.u"])]


def test_a_full_batch_goes_before_the_interval() -> None:
    async def run() -> FakeClient:
        client = FakeClient()
        f = TileFreer(client, where, interval_s=60.0, batch=3)  # type: ignore[arg-type]
        for i in range(3):
            f.free("n1", f"j.t{i}")
        await asyncio.sleep(0.05)
        await f.close()
        return client

    assert asyncio.run(run()).calls == [("h1", 1, ["j.t0", "j.t1", "j.t2"])]
