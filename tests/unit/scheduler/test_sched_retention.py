"""The scheduler's retention loop (scheduler/retention.py): it prunes only while leading,
only settled jobs, and makes the journal's writer forget what it deleted."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from triplane import metadb as mdb
from triplane.metadb.retention import RELEASED
from triplane.scheduler import cli, retention

GRAPH = json.dumps({"nodes": {"x": {"op": "input"}}, "outputs": ["x"], "version": 1}).encode()


def released_job(db: mdb.MetaDB, at: float) -> str:
    with db.transaction() as s:
        j = mdb.create_job(s, graph_hash="sha256-" + "aa" * 16, graph_json=GRAPH, fetch=[], now=at).id
        mdb.set_job_state(s, j, "done", now=at)
        mdb.add_events(s, [mdb.NewEvent(j, RELEASED)], now=at)
    return j


def count(db: mdb.MetaDB) -> int:
    with db.read() as s:
        return len(mdb.list_jobs(s, limit=100))


def test_the_loop_prunes_while_leading_and_the_writer_forgets(tmp_path: Path) -> None:
    db = mdb.open_db(f"sqlite:///{tmp_path / 'm.sqlite3'}")
    writer = mdb.BatchWriter(db)
    old = [released_job(db, time.time() - 60 + i) for i in range(4)]
    fresh = released_job(db, time.time())  # inside the grace period: kept this pass
    for j in old:
        writer.event(j, "test.seen")  # caches the ids as known
    writer.flush()
    leading = [False]

    async def run() -> None:
        task = asyncio.create_task(retention.retain(db, 2, lambda: leading[0], lambda: writer, period_s=0.05))
        await asyncio.sleep(0.3)
        assert count(db) == 5  # a standby deletes nothing
        leading[0] = True
        await asyncio.sleep(0.3)
        task.cancel()

    try:
        asyncio.run(run())
        with db.read() as s:
            left = {j.id for j in mdb.list_jobs(s, limit=100)}
        assert left == {old[-1], fresh}  # the newest two: an unsettled one counts
        try:
            writer.event(old[0], "test.late")
        except mdb.UnknownJobError:
            pass  # refused at once, not a batch failing on its foreign key
        else:
            raise AssertionError("a deleted job's write was queued")
    finally:
        writer.close()
        db.close()


def test_the_cli_defaults_are_the_schedulers() -> None:
    assert (cli.KEEP_JOBS, cli.PERIOD_S) == (retention.KEEP_JOBS, retention.PERIOD_S)
