"""The event bus: ids in order, filters, a slow subscriber cut off and caught up without
loss or duplicates, replay from the metadb once the ring buffer has moved on, ids that
continue from the metadb's after a restart, rate-limited progress."""

from __future__ import annotations

import asyncio
from pathlib import Path

from triplane import metadb as mdb
from triplane.scheduler.events import Event, EventBus, Subscription
from triplane.scheduler.journal import Journal

GRAPH = b'{"nodes":{},"outputs":[],"version":1}'


def open_db(tmp_path: Path) -> mdb.MetaDB:
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    with db.transaction() as s:
        for job, owner in (("j1", "alice"), ("j2", "bob")):
            mdb.create_job(s, graph_hash="h", graph_json=GRAPH, fetch=[], job_id=job, state="running",
                           owner=owner)
    return db


async def take(sub: Subscription, n: int) -> list[Event]:
    out = []
    async for e in sub:
        out.append(e)
        if len(out) == n:
            break
    return out


def test_ids_increase_and_filters_select() -> None:
    bus = EventBus()
    bus.own("j1", "alice")
    a = bus.publish("job.submitted", job="j1", tasks=3)
    b = bus.publish("node.up", node="ex0")
    c = bus.publish("task.failed", job="j1", task="t0", node="ex0", attempt=0)
    assert [a.id, b.id, c.id] == [1, 2, 3]
    assert c.as_dict() == {"id": 3, "at": c.at, "kind": "task.failed", "job": "j1", "task": "t0",
                           "node": "ex0", "data": {"attempt": 0}}
    assert [e.id for e in bus.query()] == [1, 2, 3]
    assert [e.id for e in bus.query(job="j1")] == [1, 3]
    assert [e.id for e in bus.query(kinds=["node.up"])] == [2]
    assert [e.id for e in bus.query(after=1, limit=1)] == [2]
    assert [e.id for e in bus.query(owner="alice")] == [1, 3]  # node events are no owner's
    assert bus.query(owner="bob") == []


def test_a_slow_subscriber_is_cut_off_and_catches_up_without_loss_or_duplicates() -> None:
    async def main() -> None:
        bus = EventBus(queue_size=10)
        sub = bus.subscribe()
        first = bus.publish("job.progress", job="j1", done=0)
        assert (await take(sub, 1)) == [first]
        for i in range(1, 500):  # nobody reads: the publisher must not wait
            bus.publish("job.progress", job="j1", done=i)
        assert sub.cut_offs == 1 and not sub.attached and bus.subscribers == 0
        got = await take(sub, 499)
        assert [e.data["done"] for e in got] == list(range(1, 500))
        assert sub.attached  # current again: back on the live feed
        late = bus.publish("job.done", job="j1")
        assert (await take(sub, 1)) == [late]
        sub.close()
        assert [e async for e in sub] == []

    asyncio.run(main())


def test_replay_reaches_past_the_ring_buffer_into_the_metadb(tmp_path: Path) -> None:
    async def main() -> None:
        db = open_db(tmp_path)
        bus = EventBus(db, ring_size=5, queue_size=4)
        journal = Journal(db, lambda job: (False, 0, 0), bus)
        journal.open()
        bus.own("j1", "alice")
        bus.own("j2", "bob")
        for i in range(20):
            bus.publish("job.progress", job="j1" if i % 2 else "j2", done=i)
        bus.publish("node.down", node="ex0")
        await asyncio.to_thread(journal.close)
        assert bus.ring_start() == 17  # 1..16 only in the metadb now
        assert [e.id for e in await bus.aquery(after=3, limit=4)] == [4, 5, 6, 7]
        assert [e.data["done"] for e in bus.query(job="j1", after=10)] == [11, 13, 15, 17, 19]
        assert [e.id for e in bus.query(owner="bob", after=14)] == [15, 17, 19]
        assert [e.kind for e in bus.query(kinds=["node.down"])] == ["node.down"]
        sub = bus.subscribe(after=0)
        got = await take(sub, 21)
        assert [e.id for e in got] == list(range(1, 22))
        assert sub.attached
        assert got[3] == bus.query(after=3, limit=1)[0]  # the metadb's copy is the event published

    asyncio.run(main())


def test_ids_continue_from_the_metadb_after_a_restart(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    bus = EventBus(db)
    journal = Journal(db, lambda job: (False, 0, 0), bus)
    journal.open()
    bus.open()
    for _ in range(3):
        bus.publish("node.up", node="ex0")
    journal.close()
    again = EventBus(db)
    again.open()
    assert again.publish("node.up", node="ex1").id == 4
    assert [e.id for e in again.query()] == [1, 2, 3, 4]


def test_progress_is_rate_limited_per_job() -> None:
    bus = EventBus()
    assert bus.progress("j1", 1, 10) is not None
    assert bus.progress("j1", 2, 10) is None  # within half a second of the last
    assert bus.progress("j2", 1, 10) is not None
    assert [e.job for e in bus.query(kinds=["job.progress"])] == ["j1", "j2"]
