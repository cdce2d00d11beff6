"""Retention (metadb/retention.py): which finished jobs' rows go, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from triplane import metadb as mdb
from triplane.metadb import MetaDB, NewEvent, NewTask, TileLocation
from triplane.metadb.models import Event, Job, Task, Tile
from triplane.metadb.retention import RELEASED, prune_jobs, releasable_jobs

GRAPH = json.dumps({"nodes": {"x": {"op": "input"}, "y": {"op": "relu", "inputs": ["x"]}},
                    "outputs": ["y"], "version": 1}, sort_keys=True, separators=(",", ":")).encode()
H = "sha256-" + "cd" * 16


def job(db: MetaDB, at: float, state: str, *, released: bool = False, tile: str | None = None) -> str:
    """A job created at ``at`` with two tasks, an event, in ``state``; a ``tile`` row in that state."""
    with db.transaction() as s:
        j = mdb.create_job(s, graph_hash=H, graph_json=GRAPH, fetch=["y"], now=at).id
        mdb.insert_tasks(s, j, [NewTask("t0", "relu"), NewTask("t1", "relu")])
        mdb.add_events(s, [NewEvent(j, "job.bindings", payload={"args": []})], now=at)
        if tile is not None:
            mdb.record_tiles(s, j, [TileLocation("t1", (), (2,), "float32", 8, "n1", state=tile)], now=at)
        if state != "submitted":
            mdb.set_job_state(s, j, state, now=at)
        if released:
            mdb.add_events(s, [NewEvent(j, RELEASED)], now=at)
    return j


def rows(db: MetaDB, model: type, j: str) -> int:
    with db.read() as s:
        col = model.id if model is Job else model.job_id
        return int(s.scalar(sa.select(sa.func.count()).select_from(model).where(col == j)) or 0)


def test_prune_deletes_exactly_the_released_jobs_beyond_the_newest_n(db: MetaDB) -> None:
    released = [job(db, 100.0 + i, "done", released=True, tile="present") for i in range(6)]
    unreleased = job(db, 50.0, "done", tile="present")  # oldest of all, its tiles still readable
    running = job(db, 51.0, "running", released=True)  # a release while running: not finished
    queued = job(db, 52.0, "submitted")
    failed_gone = job(db, 53.0, "failed")  # no present tile: nothing to read
    failed_holding = job(db, 54.0, "failed", tile="present")  # its fetched tiles still there
    cancelled_lost = job(db, 55.0, "cancelled", tile="lost")
    with db.transaction() as s:
        gone = prune_jobs(s, keep=3)
    # releasable: 6 released + failed_gone + cancelled_lost; the newest 3 (released[3:]) stay
    assert gone == 5
    kept = {*released[3:], unreleased, running, queued, failed_holding}
    for j in [*released, unreleased, running, queued, failed_gone, failed_holding, cancelled_lost]:
        expect = 1 if j in kept else 0
        assert rows(db, Job, j) == expect, j
        assert rows(db, Task, j) == 2 * expect
        assert rows(db, Event, j) >= expect and (expect or rows(db, Event, j) == 0)
    assert rows(db, Tile, released[0]) == 0 and rows(db, Tile, released[5]) == 1
    with db.read() as s:
        assert mdb.get_graph(s, H).node_count == 2  # still the graph of the kept jobs
        assert mdb.get_job(s, unreleased).state == "done"
    with db.transaction() as s:
        assert prune_jobs(s, keep=3) == 0  # nothing left beyond the bound


def test_prune_works_in_batches_and_keep_zero_empties_the_releasable(db: MetaDB) -> None:
    jobs = [job(db, 10.0 + i, "done", released=True) for i in range(7)]
    done = 0
    while True:
        with db.transaction() as s:
            n = prune_jobs(s, keep=0, limit=3)
        assert n <= 3
        done += n
        if n < 3:
            break
    assert done == 7 and all(rows(db, Job, j) == 0 for j in jobs)


def test_older_than_deletes_stale_released_jobs_within_the_bound(db: MetaDB) -> None:
    old = job(db, 10.0, "done", released=True)
    new = job(db, 1000.0, "done", released=True)
    kept_unreleased = job(db, 5.0, "done")
    with db.read() as s:
        assert releasable_jobs(s, keep=10) == []
        assert releasable_jobs(s, keep=10, older_than=500.0) == [old]
    with db.transaction() as s:
        assert prune_jobs(s, keep=10, older_than=500.0) == 1
    assert rows(db, Job, old) == 0 and rows(db, Job, new) == 1 and rows(db, Job, kept_unreleased) == 1


def test_bad_bounds_are_refused(db: MetaDB) -> None:
    with db.read() as s, pytest.raises(mdb.InvalidInputError, match="keep"):
        releasable_jobs(s, keep=-1)


def test_graphs_and_plans_go_with_their_last_job(db: MetaDB) -> None:
    other = GRAPH.replace(b"relu", b"tanh")
    h2 = "sha256-" + "ef" * 16
    with db.transaction() as s:
        lone = mdb.create_job(s, graph_hash=h2, graph_json=other, fetch=["y"], now=1.0).id
        plan = mdb.upsert_plan(s, graph_hash=h2, structure_hash="s1", plan={"tasks": []}, now=1.0)
        mdb.set_job_state(s, lone, "done", plan_id=plan.id, now=1.0)
        mdb.add_events(s, [NewEvent(lone, RELEASED)], now=1.0)
    a = job(db, 2.0, "done", released=True)
    b = job(db, 3.0, "done")  # unreleased, same graph H as a
    with db.transaction() as s:
        shared = mdb.upsert_plan(s, graph_hash=H, structure_hash="s1", plan={"tasks": []}, now=1.0)
        mdb.set_job_state(s, a, "done", plan_id=shared.id, now=2.0)
        mdb.set_job_state(s, b, "done", plan_id=shared.id, now=3.0)
    with db.transaction() as s:
        assert prune_jobs(s, keep=0) == 2
    with db.read() as s:
        assert mdb.get_plan(s, h2, "s1") is None
        with pytest.raises(mdb.NotFoundError):
            mdb.get_graph(s, h2)
        assert mdb.get_graph(s, H).hash == H and mdb.get_plan(s, H, "s1") is not None  # b uses them
    with db.transaction() as s:  # the graph is stored again by the next job that has it
        again = mdb.create_job(s, graph_hash=h2, graph_json=other, fetch=["y"]).id
    assert rows(db, Job, again) == 1 and rows(db, Job, b) == 1


def test_unsettled_jobs_count_in_the_bound_and_are_not_deleted(db: MetaDB) -> None:
    old = [job(db, 10.0 + i, "done", released=True) for i in range(3)]
    recent = [job(db, 100.0 + i, "done", released=True) for i in range(3)]
    with db.read() as s:
        # keep 2: the two newest are recent ones; of the rest only the settled (old) go
        assert set(releasable_jobs(s, keep=2, settled_before=50.0)) == set(old)
        assert set(releasable_jobs(s, keep=2)) == {*old, recent[0]}
