"""Replicas spread over executors (``host.spread_replicas``): each cluster session is
given an executor to prefer, round robin over those up and not drained, by name; its
jobs name it. The sessions are real ``RemoteSession``s over an in-memory transport
(STYLE.md 10): no sockets."""

from __future__ import annotations

import json

import httpx

from triplane.embedded import EmbeddedSession
from triplane.sdk.remote import RemoteSession
from triplane.serving.host import spread_replicas


def _sessions(nodes: list[dict], n: int, jobs: list[dict]) -> list[RemoteSession]:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/nodes":
            return httpx.Response(200, json={"items": nodes, "next": None})
        if request.url.path == "/v1/jobs":
            jobs.append(json.loads(request.content))
            return httpx.Response(201, json={"id": "j1", "state": "running", "plan": "p", "args": []})
        return httpx.Response(404, json={"error": {"kind": "not_found", "message": request.url.path}})

    return [RemoteSession("http://sched", "t", httpx.MockTransport(handler), lease=False, release=False)
            for _ in range(n)]


def _node(name: str, health: str = "up", drained: bool = False) -> dict:
    return {"node": name, "health": health, "drained": drained}


def test_replicas_go_round_robin_over_the_executors_up_and_their_jobs_name_them() -> None:
    jobs: list[dict] = []
    nodes = [_node("exec-b"), _node("exec-a"), _node("exec-c", drained=True), _node("exec-d", health="down")]
    sessions = _sessions(nodes, 3, jobs)
    assert spread_replicas(sessions) == ["exec-a", "exec-b", "exec-a"]
    sessions[1].submit_job({"plan": "p", "args": [], "fetch": ["y"]})
    sessions[2].submit_job({"graph": {"version": 1, "nodes": {}, "outputs": []}, "fetch": []})
    assert [j["prefer"] for j in jobs] == ["exec-b", "exec-a"]


def test_no_executor_up_or_an_embedded_session_is_left_alone() -> None:
    sessions = _sessions([_node("exec-a", drained=True)], 2, [])
    assert spread_replicas(sessions) == [None, None]
    assert [s.prefer for s in sessions] == [None, None]
    embedded = [EmbeddedSession(), EmbeddedSession()]
    assert spread_replicas(embedded) == [None, None]
    assert not any(hasattr(e, "prefer") for e in embedded)
