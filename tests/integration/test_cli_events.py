"""``triplane events --follow``: the server-sent event stream read by the CLI's client,
resumed with ``Last-Event-ID`` after a dropped connection without loss or duplicates, and
ended after the job's last event with ``--job`` (against an httpx MockTransport that
serves the contract's stream: ``id:`` = event id, ``data:`` = the event's JSON)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from triplane import cli_events
from triplane.cli import app
from triplane.cli_client import AdminClient


def event(i: int, kind: str = "job.progress", job: str = "j1") -> dict[str, Any]:
    return {"id": i, "at": 1.0e9 + i, "kind": kind, "job": job, "task": None, "node": None,
            "data": {"done": i}}


def frames(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f": keep-alive\nid: {e['id']}\nevent: {e['kind']}\ndata: {json.dumps(e)}\n\n".encode()
                    for e in events)


class Stream:
    """Serves ``events`` from the requested id on; the first ``drops`` connections break
    after ``per`` events (a dropped connection). Records each request's resume point."""

    def __init__(self, events: list[dict[str, Any]], drops: int = 0, per: int = 3) -> None:
        self.events, self.drops, self.per = events, drops, per
        self.resumed: list[tuple[str | None, str | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/events"
        assert request.headers["accept"] == "text/event-stream"
        last = request.headers.get("last-event-id")
        self.resumed.append((last, request.url.params.get("after")))
        start = int(last) if last else 0
        rest = [e for e in self.events if e["id"] > start]
        if self.drops:
            self.drops -= 1
            head = frames(rest[:self.per])

            def broken() -> Iterator[bytes]:
                yield head
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message")

            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=broken())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=frames(rest))


def test_the_stream_resumes_after_a_drop_without_loss_or_duplicates() -> None:
    stream = Stream([event(i) for i in range(1, 11)], drops=2, per=3)
    client = AdminClient("http://sched", "t", transport=httpx.MockTransport(stream))
    got = list(itertools.islice(cli_events.follow_events(client, [("job", "j1")], None), 10))
    assert [e["id"] for e in got] == list(range(1, 11))
    assert got[0] == event(1)
    assert stream.resumed[:3] == [(None, None), ("3", "3"), ("6", "6")]


def test_a_stream_that_keeps_closing_empty_ends_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_events.time, "sleep", lambda s: None)
    client = AdminClient("http://sched", "t", transport=httpx.MockTransport(Stream([])))
    with pytest.raises(cli_events.CliError, match="closed 5 times in a row without an event"):
        list(cli_events.follow_events(client, [], None))


def test_events_follow_job_ends_after_the_jobs_last_event(monkeypatch: pytest.MonkeyPatch) -> None:
    evs = [event(1, "job.submitted"), event(2, "job.running"), event(3), event(4, "job.done"), event(5)]
    stream = Stream(evs, drops=1, per=2)
    monkeypatch.setattr(cli_events, "client_of", lambda *a: AdminClient(
        "http://sched", "t", transport=httpx.MockTransport(stream)))
    r = CliRunner().invoke(app, ["events", "--job", "j1", "--follow", "--json"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert [e["id"] for e in lines] == [1, 2, 3, 4]  # resumed once, stopped at job.done
    text = CliRunner().invoke(app, ["logs", "--job", "j1", "--follow"], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert "job.done" in text.stdout and "job=j1" in text.stdout


def test_an_error_answer_to_the_stream_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"kind": "unauthorized", "message": "wrong bearer token"}})

    monkeypatch.setattr(cli_events, "client_of", lambda *a: AdminClient(
        "http://sched", "t", transport=httpx.MockTransport(refuse)))
    r = CliRunner().invoke(app, ["events", "--follow"], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "refused the token (401" in r.output, r.output
