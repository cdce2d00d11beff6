"""``GET /v1/events`` pages and ``GET /metrics`` over a scheduler that is not started
(events are published on its bus by hand; the live stream and a real job's counts are
tests/integration/cluster/test_cluster_events.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from triplane import metadb as mdb
from triplane.registry import MemoryBackend
from triplane.scheduler.api.app import create_app
from triplane.scheduler.api.events import decode_cursor, encode_cursor
from triplane.scheduler.api.tokens import add_token
from triplane.scheduler.service import Scheduler

ADMIN = "admin-token-0123456789"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Scheduler, TestClient, dict[str, dict[str, str]]]:
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=MemoryBackend(), db=db, run_dir=tmp_path, secret=b"s" * 32)
    tokens = tmp_path / "tokens.json"
    heads = {"admin": ADMIN, "alice": add_token(tokens, "alice", "submit"),
             "reader": add_token(tokens, "reader", "read")}
    c = TestClient(create_app(s, ADMIN, tokens_file=tokens))
    return s, c, {k: {"Authorization": f"Bearer {v}"} for k, v in heads.items()}


def test_pages_filters_and_cursors(setup: tuple[Scheduler, TestClient, dict[str, dict[str, str]]]) -> None:
    s, c, h = setup
    s.events.own("ja", "alice")
    s.events.own("jb", "bob")
    for i in range(5):
        s.events.publish("job.progress", job="ja" if i % 2 == 0 else "jb", done=i, total=5)
    s.events.publish("node.down", node="ex0")
    r = c.get("/v1/events", params={"limit": 2}, headers=h["reader"])
    assert r.status_code == 200, r.text
    page = r.json()
    assert [e["id"] for e in page["items"]] == [1, 2] and page["next"]
    items = page["items"]
    while page["next"]:  # a full page has a next; the one after the last may be empty
        page = c.get("/v1/events", params={"limit": 2, "cursor": page["next"]}, headers=h["reader"]).json()
        items += page["items"]
    assert [e["id"] for e in items] == [1, 2, 3, 4, 5, 6]
    assert items[-1] == {"id": 6, "at": items[-1]["at"], "kind": "node.down", "job": None, "task": None,
                         "node": "ex0", "data": {}}
    only = c.get("/v1/events", params={"job": "jb", "after": 2}, headers=h["admin"]).json()
    assert [e["data"]["done"] for e in only["items"]] == [3] and only["next"] is None
    kinds = c.get("/v1/events", params=[("kind", "node.down"), ("kind", "node.up")],
                  headers=h["admin"]).json()
    assert [e["id"] for e in kinds["items"]] == [6]
    # a submit token: its own jobs' events only, no executor events, no other job by name
    mine = c.get("/v1/events", headers=h["alice"]).json()
    assert [(e["job"], e["data"]["done"]) for e in mine["items"]] == [("ja", 0), ("ja", 2), ("ja", 4)]


Setup = tuple[Scheduler, TestClient, dict[str, dict[str, str]]]


def test_bad_requests_name_what_is_wrong(setup: Setup) -> None:
    _, c, h = setup
    r = c.get("/v1/events", params={"cursor": "nope"}, headers=h["admin"])
    assert r.status_code == 400 and "bad cursor" in r.json()["error"]["message"]
    r = c.get("/v1/events", params={"kind": "job.exploded"}, headers=h["admin"])
    assert r.status_code == 400 and "job.exploded" in r.json()["error"]["message"]
    assert c.get("/v1/events", params={"limit": 0}, headers=h["admin"]).status_code == 400
    assert c.get("/v1/events").status_code == 401
    assert c.get("/metrics").status_code == 401
    assert decode_cursor(encode_cursor(41)) == 41


def test_metrics_parse_and_count(setup: Setup) -> None:
    s, c, h = setup
    s.counts.tasks["succeeded", "matmul", "ex0"] += 3
    s.counts.task_latency.observe(0.002)
    s.events.publish("job.running", job="j")
    s.events.publish("job.done", job="j")
    r = c.get("/metrics", headers=h["reader"])
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    ok = [x for x in fams["triplane_tasks_succeeded"].samples if x.name.endswith("_total")]
    assert [(x.labels, x.value) for x in ok] == [({"op": "matmul", "node": "ex0"}, 3.0)]
    lat = {x.name: x.value for x in fams["triplane_task_latency_seconds"].samples if not x.labels.get("le")}
    assert lat["triplane_task_latency_seconds_count"] == 1.0
    jobs = [x for x in fams["triplane_job_duration_seconds"].samples if x.name.endswith("_count")]
    assert [(x.labels, x.value) for x in jobs] == [({"state": "done"}, 1.0)]
    assert fams["triplane_events_published"].samples[0].value == 2.0
    for name in ("triplane_queue_depth", "triplane_tasks_dispatched", "triplane_dispatch_latency_seconds",
                 "triplane_plan_cache_hits", "triplane_executor_memory_free_bytes"):
        assert name in fams
