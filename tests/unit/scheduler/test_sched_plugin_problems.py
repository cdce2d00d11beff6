"""The plugins each executor isolated, as the scheduler reads them from the executors'
``stats/<node>`` records for ``GET /v1/nodes`` and ``triplane status``."""

from __future__ import annotations

import asyncio
import json

from triplane.launcher.commands import plugins_of
from triplane.registry import MemoryBackend
from triplane.scheduler.cluster import read_plugin_problems


def test_reads_each_nodes_isolated_plugins_and_skips_a_malformed_record() -> None:
    async def go() -> dict[str, list[dict[str, str]]]:
        reg = MemoryBackend()
        bad = {"kind": "op", "name": "explodes", "message": "cannot be made: RuntimeError: no driver"}
        await reg.put("stats/e0", json.dumps({"node": "e0", "plugins": [bad]}).encode())
        await reg.put("stats/e1", json.dumps({"node": "e1", "plugins": []}).encode())
        await reg.put("stats/e2", b"not json")
        await reg.put("stats/e3", json.dumps({"plugins": "not a list of records"}).encode())
        return await read_plugin_problems(reg)

    found = asyncio.run(go())
    assert found == {"e0": [{"kind": "op", "name": "explodes", "message": "cannot be made: RuntimeError: "
                                                                             "no driver"}], "e1": []}
    rows = plugins_of([{"node": n, "plugins": p} for n, p in found.items()] + [{"node": "e9"}, "junk"])
    assert rows == [{"process": "e0", "kind": "op", "name": "explodes",
                     "message": "cannot be made: RuntimeError: no driver",
                     "problem": "op plugin 'explodes': cannot be made: RuntimeError: no driver"}]
