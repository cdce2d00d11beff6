"""The event stream and the metrics of a real local cluster (issue 13, "Must show"): the SSE
stream delivers a job's events in order; a client whose connection drops resumes with
Last-Event-ID without loss or duplicates; a client that stops reading neither stalls the
dispatcher nor loses events; ``/metrics`` parses with prometheus-client's parser and its
task counters agree with the job's task rows."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from cluster_rows import task_rows
from prometheus_client.parser import text_string_to_metric_families

TASKS = 2000  # independent tasks: more than a grouped job's 256, so one task per node
SSE = {"Accept": "text/event-stream"}


def noop_graph(n: int, salt: float) -> dict[str, Any]:
    """``n`` independent 0-d ``full`` tasks, every one an output (as bench/dispatch.py)."""
    nodes = {f"f{i}": {"op": "full", "shape": [], "dtype": "float32",
                       "attrs": {"value": salt + i, "shape": [], "dtype": "float32"}} for i in range(n)}
    return {"graph": {"version": 1, "nodes": nodes, "outputs": list(nodes)}, "fetch": []}


def frames(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The events of an SSE line stream (comments skipped), each with its ``id:`` checked."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in fields:
                e = json.loads(fields["data"])
                assert int(fields["id"]) == e["id"] and fields["event"] == e["kind"]
                yield e
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


def read_until(lines: Iterator[str], stop: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    out = []
    for e in frames(lines):
        out.append(e)
        if stop(e):
            return out
    raise AssertionError(f"the stream ended before the awaited event; got {out}")


def test_stream_order_resume_slow_reader_and_metrics(start_cluster: Any) -> None:
    with start_cluster(bound_s=180.0, executors=2) as c:
        auth = {"Authorization": f"Bearer {c.token}"}
        live: list[dict[str, Any]] = []
        with httpx.Client(base_url=c.url, headers=auth, timeout=httpx.Timeout(60.0)) as client, \
                client.stream("GET", "/v1/events", headers=SSE) as slow:
            assert slow.status_code == 200 and slow.headers["content-type"].startswith("text/event-stream")
            # `slow` is never read until the job is over: the scheduler's socket fills up.
            started = threading.Event()

            def follow() -> None:
                with httpx.Client(base_url=c.url, headers=auth, timeout=60.0) as cl, \
                        cl.stream("GET", "/v1/events", headers=SSE) as r:
                    started.set()
                    live.extend(read_until(r.iter_lines(), lambda e: e["kind"] in (
                        "job.done", "job.failed", "job.cancelled")))

            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            assert started.wait(30)
            time.sleep(0.2)  # the stream's subscription is in place once its headers came
            t0 = time.monotonic()
            r = client.post("/v1/jobs", json=noop_graph(TASKS, time.time() % 1000))
            assert r.status_code == 201, r.text
            job = r.json()["id"]
            status = client.get(f"/v1/jobs/{job}/wait", params={"timeout": 60}).json()
            took = time.monotonic() - t0
            assert status["state"] == "done", status
            reader.join(30)
            assert not reader.is_alive()

            # 1. in order: ids strictly increasing, the job's life in its order
            ids = [e["id"] for e in live]
            assert ids == sorted(set(ids))
            kinds = [e["kind"] for e in live if e["job"] == job]
            assert kinds[:2] == ["job.submitted", "job.running"] and kinds[-1] == "job.done"
            assert set(kinds[2:-1]) <= {"job.progress"}
            assert live[-1]["data"]["done"] == TASKS

            # 2. the reader that stopped: every event since it connected, once, in order
            got = read_until(slow.iter_lines(), lambda e: e["kind"] == "job.done" and e["job"] == job)
            assert [e["id"] for e in got] == list(range(got[0]["id"], got[-1]["id"] + 1))
            assert [e for e in got if e["job"] == job] == [e for e in live if e["job"] == job]
            print(f"\n{TASKS} tasks in {took:.2f} s with a stalled SSE reader attached")

        # 3. a dropped connection resumes by Last-Event-ID: nothing lost, nothing twice
        everything = client_get(c.url, auth, "/v1/events", {"job": job, "limit": 1000})["items"]
        assert [e["kind"] for e in everything] == kinds
        with httpx.Client(base_url=c.url, headers=auth, timeout=30.0) as cl:
            with cl.stream("GET", "/v1/events", headers=SSE, params={"job": job, "after": 0}) as r:
                first = read_until(r.iter_lines(), lambda e: True)  # one event, then hang up
            with cl.stream("GET", "/v1/events", params={"job": job},
                           headers={**SSE, "Last-Event-ID": str(first[-1]["id"])}) as r:
                rest = read_until(r.iter_lines(), lambda e: e["kind"] == "job.done")
        assert first + rest == everything

        # 4. the metrics agree with the job's task rows
        text = httpx.get(f"{c.url}/metrics", headers=auth, timeout=10.0).text
        fams = {f.name: f for f in text_string_to_metric_families(text)}

        def total(name: str) -> float:
            return sum(s.value for s in fams[name].samples if s.name.endswith("_total"))

        rows = task_rows(c.db, job)
        assert len(rows) == TASKS and all(r.state == "done" for r in rows)
        assert total("triplane_tasks_succeeded") == len(rows)
        assert total("triplane_tasks_dispatched") >= len(rows)
        assert total("triplane_tasks_failed") == 0
        by_node: dict[str, int] = {}
        for row in rows:
            by_node[row.node] = by_node.get(row.node, 0) + 1
        assert {s.labels["node"]: s.value for s in fams["triplane_tasks_succeeded"].samples
                if s.name.endswith("_total")} == by_node
        lat = [s for s in fams["triplane_task_latency_seconds"].samples if s.name.endswith("_count")]
        assert lat[0].value == TASKS
        assert any(s.value > 0 for s in fams["triplane_executor_memory_capacity_bytes"].samples)


def client_get(url: str, auth: dict[str, str], path: str, params: dict[str, Any]) -> Any:
    r = httpx.get(f"{url}{path}", headers=auth, params=params, timeout=10.0)
    assert r.status_code == 200, r.text
    return r.json()
