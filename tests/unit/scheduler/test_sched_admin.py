"""The admin routes over a Scheduler that is not started (docs/api.md): pages and cursors,
job filters, names and tags, cancel and retry, tasks and tiles, node drain (in the
registry, the placement figures and the dispatcher), config and tokens.

No sockets: the app runs in memory (as test_sched_api.py); executors are registry records,
so jobs are accepted and stay running. The dispatcher's part of a drain is checked on the
pure state machine."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from triplane import metadb as mdb
from triplane.registry import MemoryBackend, NodeInfo, OpEngineInfo, list_drained
from triplane.registry.records import encode
from triplane.scheduler.api.app import create_app
from triplane.scheduler.api.pages import decode_cursor, encode_cursor
from triplane.scheduler.api.tokens import add_token
from triplane.scheduler.dispatch.state import (
    DispatchState,
    NodeUp,
    Policy,
    Send,
    SubmitJob,
    TaskErred,
    TaskSpec,
    TaskSucceeded,
)
from triplane.scheduler.errors import BadRequest
from triplane.scheduler.service import Scheduler

ADMIN = "admin-token-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}


class Api:
    def __init__(self, tmp_path: Path) -> None:
        self.registry = MemoryBackend()
        for n in ("n1", "n2"):
            info = OpEngineInfo(n, "numpy", "numpy", "cpu", ("exp", "add"), ("float32",), 1.0, 1.0)
            node = NodeInfo(n, "127.0.0.1", 1, 1, 1, "test", 0.0, 1)
            asyncio.run(self.registry.put(info.key(), encode(info)))
            asyncio.run(self.registry.put(node.key(), encode(node)))
        self.db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
        self.s = Scheduler(registry=self.registry, db=self.db, run_dir=tmp_path, secret=b"s" * 32,
                           group_tiny_jobs=False)
        self.tokens = tmp_path / "tokens.json"
        self.alice = {"Authorization": f"Bearer {add_token(self.tokens, 'alice', 'submit')}"}
        self.reader = {"Authorization": f"Bearer {add_token(self.tokens, 'reader', 'read')}"}
        self.c = TestClient(create_app(self.s, ADMIN, tokens_file=self.tokens))

    def upload(self, headers: dict[str, str] = H) -> str:
        r = self.c.post("/v1/tensors", content=bytes(16), headers={
            **headers, "X-Triplane-Shape": "2,2", "X-Triplane-Dtype": "float32"})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def submit(self, headers: dict[str, str] = H, tasks: int = 1, **extra: object) -> str:
        """A job of ``tasks`` independent exp tasks, each fetched (so none is fused away)."""
        nodes: dict[str, dict] = {"x": {"op": "input", "shape": [2, 2], "dtype": "float32", "attrs": {
            "tensor": self.upload(headers), "shape": [2, 2], "dtype": "float32"}}}
        for i in range(tasks):
            nodes[f"y{i}"] = {"op": "exp", "inputs": ["x"], "shape": [2, 2], "dtype": "float32"}
        fetch = [f"y{i}" for i in range(tasks)]
        body = {"graph": {"version": 1, "nodes": nodes, "outputs": fetch}, "fetch": fetch, **extra}
        r = self.c.post("/v1/jobs", json=body, headers=headers)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def pages(self, path: str, limit: int, headers: dict[str, str] = H, **params: object) -> list[list[dict]]:
        out, cursor = [], None
        while True:
            r = self.c.get(path, params={**params, "limit": limit, **({"cursor": cursor} if cursor else {})},
                           headers=headers)
            assert r.status_code == 200, r.text
            out.append(r.json()["items"])
            cursor = r.json()["next"]
            if cursor is None:
                return out


@pytest.fixture
def api(tmp_path: Path) -> Api:
    return Api(tmp_path)


def test_cursors_are_opaque_round_trips_and_a_bad_one_is_400() -> None:
    assert decode_cursor(encode_cursor([1.5, "j1"]), (float, str)) == [1.5, "j1"]
    assert decode_cursor(None, (str,)) is None
    for bad, types in (("!!!", (str,)), (encode_cursor(["a"]), (float, str)), (encode_cursor([1]), (str,))):
        with pytest.raises(BadRequest, match="not a cursor"):
            decode_cursor(bad, types)


def test_jobs_pages_cover_every_job_once_newest_first_and_stay_stable_under_inserts(api: Api) -> None:
    ids = [api.submit() for _ in range(7)]
    pages = api.pages("/v1/jobs", 3)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [j["id"] for p in pages for j in p] == ids[::-1]
    first = api.c.get("/v1/jobs", params={"limit": 3}, headers=H).json()
    newer = api.submit()  # stored between two page reads: not on a later page, nothing repeats
    second = api.c.get("/v1/jobs", params={"limit": 3, "cursor": first["next"]}, headers=H).json()
    assert [j["id"] for j in second["items"]] == ids[::-1][3:6] and newer not in str(second)
    r = api.c.get("/v1/jobs", params={"cursor": "not-a-cursor"}, headers=H)
    assert r.status_code == 400 and r.json()["error"]["kind"] == "request"
    for limit in (0, 1001):
        assert api.c.get("/v1/jobs", params={"limit": limit}, headers=H).status_code == 400


def test_jobs_carry_name_and_tags_and_filter_by_them_state_owner_and_time(api: Api) -> None:
    a = api.submit(name="train", tags=["exp1", "gpu"])
    t_mid = time.time()
    b = api.submit(name="train", tags=["exp1"])
    c = api.submit(api.alice, name="eval", tags=["gpu"])
    body = api.c.get(f"/v1/jobs/{a}", headers=H).json()
    assert body["name"] == "train" and body["tags"] == ["exp1", "gpu"] and body["owner"] == "admin"

    def ids(**params: object) -> list[str]:
        return [j["id"] for p in api.pages("/v1/jobs", 2, **params) for j in p]

    assert ids(name="train") == [b, a]
    assert ids(tag="exp1") == [b, a]
    assert ids(tag=["exp1", "gpu"]) == [a]  # every tag must match
    assert ids(owner="alice") == [c]
    assert ids(since=t_mid) == [c, b] and ids(until=t_mid) == [a]
    assert ids(state="running") == [c, b, a] and ids(state="done") == []
    assert [j["id"] for j in api.c.get("/v1/jobs", headers=api.alice).json()["items"]] == [c]
    assert api.c.get("/v1/jobs", params={"owner": "admin"}, headers=api.alice).status_code == 403
    assert api.c.get("/v1/jobs", params={"state": "bogus"}, headers=H).status_code == 400
    for bad in ({"name": ""}, {"name": "x" * 129}, {"tags": ["t"] * 17}, {"tags": ["x" * 65]},
                {"tags": "gpu"}, {"tags": [1]}):
        r = api.c.post("/v1/jobs", json={"graph": {"version": 1, "nodes": {}, "outputs": []}, "fetch": [],
                                         **bad}, headers=H)
        assert r.status_code == 400 and ("name" in r.text or "tags" in r.text), (bad, r.text)


def test_cancel_by_post_and_retry_makes_a_new_job_of_the_same_graph(api: Api) -> None:
    job = api.submit(tasks=2, name="step", tags=["nightly"])
    r = api.c.post(f"/v1/jobs/{job}/retry", headers=H)
    assert r.status_code == 409 and "running" in r.json()["error"]["message"]  # only failed or cancelled
    assert api.c.post(f"/v1/jobs/{job}/cancel", headers=H).json()["state"] == "cancelled"
    r = api.c.post(f"/v1/jobs/{job}/retry", headers=H)
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["retry_of"] == job and new["id"] != job and new["state"] == "running"
    body = api.c.get(f"/v1/jobs/{new['id']}", headers=H).json()
    assert body["name"] == "step" and body["tags"] == ["nightly"] and body["progress"]["total"] == 2
    with api.db.read() as s:
        assert mdb.get_job(s, new["id"]).graph_hash == mdb.get_job(s, job).graph_hash
    assert api.c.post("/v1/jobs/j0000000000000000/retry", headers=H).status_code == 404
    theirs = api.submit()
    assert api.c.post(f"/v1/jobs/{theirs}/cancel", headers=api.alice).status_code == 403
    assert api.c.post(f"/v1/jobs/{theirs}/retry", headers=api.reader).status_code == 403
    hers = api.submit(api.alice)
    assert api.c.delete(f"/v1/jobs/{hers}", headers=api.alice).json()["state"] == "cancelled"
    again = api.c.post(f"/v1/jobs/{hers}/retry", headers=H).json()["id"]  # an admin retries it ...
    assert api.c.get(f"/v1/jobs/{again}", headers=api.alice).json()["owner"] == "alice"  # ... hers still


def test_tasks_and_tiles_pages(api: Api) -> None:
    job = api.submit(tasks=5)
    with api.db.read() as s:
        t0, t1 = [t.task_id for t in mdb.list_tasks(s, job)][:2]  # canonical ids
    with api.db.transaction() as s:
        mdb.transition_task(s, job, t0, "failed", attempt=1, node="n2", error_kind="user",
                            error_message="boom")
        mdb.add_events(s, [mdb.NewEvent(job, "task.drifted", task_id=t1, stimulus_id="tick-3", at=5.0,
                                        node="n1", seq=1, payload={"from": "dispatched", "to": "ready",
                                                                   "attempt": 1, "reason": "tick-3"})])
        tiles = [mdb.TileLocation("y4", (i, 0), (1, 2), "float32", 8, "n1", "host") for i in range(2)]
        mdb.record_tiles(s, job, [*tiles, mdb.TileLocation("y3", (), (2, 2), "float32", 16, "n2")])
    api.s.shell.state.jobs.clear()  # as once the dispatcher is done with it: the rows tell
    pages = api.pages(f"/v1/jobs/{job}/tasks", 2)
    tasks = [t for p in pages for t in p]
    assert [len(p) for p in pages] == [2, 2, 1] and len({t["id"] for t in tasks}) == 5
    by_id = {t["id"]: t for t in tasks}
    failed = next(t for t in tasks if t["state"] == "failed")
    error = failed["error"]
    assert failed["node"] == "n2" and (error["kind"], error["message"]) == ("user", "boom")
    # the submitted node it computes (the job is held in memory: its plan says), no loc sent
    assert error["node"] in {f"y{i}" for i in range(5)} and error["loc"] is None
    assert failed["attempt"] == 1 and {"queued_at", "started_at", "finished_at", "predicted_s",
                                       "actual_s", "op"} <= set(failed)
    assert by_id[t0] is failed and [t["id"] for t in by_id.values() if t["drifts"]] == [t1]
    assert by_id[t1]["drifts"] == [{"at": 5.0, "attempt": 1, "from": "n1", "to": None, "reason": "tick-3"}]
    tiles = [t for p in api.pages(f"/v1/jobs/{job}/tiles", 2) for t in p]
    assert [(t["tensor"], t["index"]) for t in tiles] == [("y3", []), ("y4", [0, 0]), ("y4", [1, 0])]
    assert tiles[1]["memory_engine"] == "host" and tiles[1]["nbytes"] == 8 and tiles[1]["node"] == "n1"
    for path in ("tasks", "tiles"):
        assert api.c.get(f"/v1/jobs/j0000000000000000/{path}", headers=H).status_code == 404
    # once the job left memory, its stored error (job.failed) names the failed task's node and loc
    with api.db.transaction() as s:
        mdb.add_events(s, [mdb.NewEvent(job, "job.failed", at=6.0, seq=2, payload={
            "kind": "user", "message": "boom", "task": t0, "node": "y0", "op": "exp", "loc": "train.py:12"})])
    api.s.jobs.live.pop(job)
    stored = {t["id"]: t for t in api.c.get(f"/v1/jobs/{job}/tasks", headers=H).json()["items"]}
    assert stored[t0]["error"] == {"kind": "user", "message": "boom", "node": "y0", "loc": "train.py:12"}
    assert stored[t1]["error"] is None


def test_a_live_jobs_tasks_read_state_and_node_from_memory_before_their_rows_catch_up(api: Api) -> None:
    job = api.submit(tasks=2)
    out = api.s.shell.state.handle(NodeUp("up", "n1", 4, time.time()))  # instructions only: no I/O
    assert sum(isinstance(i, Send) for i in out) == 2
    rows = api.c.get(f"/v1/jobs/{job}/tasks", headers=H).json()["items"]
    assert [(t["state"], t["node"], t["attempt"]) for t in rows] == [("dispatched", "n1", 0)] * 2
    with api.db.read() as s:  # the rows still hold what was stored: the journal writes them later
        assert {(t.state, t.node) for t in mdb.list_tasks(s, job)} == {("ready", None)}


def test_drain_is_kept_in_the_registry_and_leaves_the_node_out_of_placement(api: Api) -> None:
    assert [n["drained"] for n in api.c.get("/v1/nodes", headers=H).json()["items"]] == [False, False]
    r = api.c.post("/v1/nodes/n1/drain", headers=H)
    assert r.status_code == 200 and r.json()["drained"] is True and r.json()["drained_at"] > 0
    assert [d.node for d in asyncio.run(list_drained(api.registry))] == ["n1"]  # every replica reads it
    assert api.s.shell.state.drained == {"n1"}
    figures, _ = asyncio.run(api.s.cluster.figures())
    assert [f.name for f in figures] == ["n2"]
    assert api.c.get("/v1/nodes/n1", headers=H).json()["drained"] is True
    assert api.c.post("/v1/nodes/n1/drain", headers=api.alice).status_code == 403
    assert api.c.post("/v1/nodes/n1/drain", headers=api.reader).status_code == 403
    assert api.c.post("/v1/nodes/nope/drain", headers=H).status_code == 404
    assert api.c.get("/v1/nodes/nope", headers=H).status_code == 404
    assert api.c.get("/v1/config", headers=H).json()["drained"] == ["n1"]
    assert api.c.post("/v1/nodes/n1/undrain", headers=H).json()["drained"] is False
    assert asyncio.run(list_drained(api.registry)) == [] and api.s.shell.state.drained == frozenset()
    figures, _ = asyncio.run(api.s.cluster.figures())
    assert [f.name for f in figures] == ["n1", "n2"]
    events = api.c.get("/v1/events", params=[("kind", "node.drained"), ("kind", "node.undrained")],
                       headers=H).json()["items"]
    assert [(e["kind"], e["node"], e["data"]["by"]) for e in events] == [
        ("node.drained", "n1", "admin"), ("node.undrained", "n1", "admin")]


def _state(*nodes: str) -> DispatchState:
    s = DispatchState(Policy(retry_backoff_s=0.0))
    for n in nodes:
        s.handle(NodeUp(f"up-{n}", n, 2, 0.0))
    return s


def test_the_dispatcher_places_nothing_new_on_a_drained_node_and_running_tasks_finish() -> None:
    s = _state("n1", "n2")
    specs = tuple(TaskSpec(f"t{i}", "exp", node="n1" if i % 2 else None) for i in range(6))
    out = s.handle(SubmitJob("sub", "j", specs, 0.0))
    first = [i for i in out if isinstance(i, Send)]
    on_n1 = [x for x in first if x.node == "n1"]
    assert on_n1  # before the drain, n1 runs some
    s.drained = frozenset({"n1"})
    later: list[Send] = []
    for i, x in enumerate(first):  # the running ones finish where they are
        out = s.handle(TaskSucceeded(f"ok{i}", x.job, x.task, x.attempt, x.node, 1.0))
        later += [y for y in out if isinstance(y, Send)]
    while later:
        x = later.pop()
        assert x.node == "n2", x  # placed (also those placement chose n1 for) on n2 only
        later += [y for y in s.handle(TaskSucceeded(f"ok-{x.task}", x.job, x.task, x.attempt, x.node, 2.0))
                  if isinstance(y, Send)]
    assert all(t.state == "done" for t in s.tasks_of("j"))
    s.validate_state()


def test_a_drifting_task_never_goes_to_a_drained_node() -> None:
    s = _state("n1", "n2")
    s.drained = frozenset({"n1"})
    (x,) = [i for i in s.handle(SubmitJob("sub", "j", (TaskSpec("t0", "exp"),), 0.0)) if isinstance(i, Send)]
    assert x.node == "n2"
    for k in range(3):  # infra failures on n2: it drifts, but never to drained n1
        out = s.handle(TaskErred(f"e{k}", "j", "t0", x.attempt, "n2", "infra", "memory full", 1.0 + k))
        out += s.handle(NodeUp(f"tick{k}", "n2", 2, 1.5 + k))
        sent = [i for i in out if isinstance(i, Send)]
        assert all(i.node == "n2" for i in sent), sent
        x = sent[0] if sent else x
    s.validate_state()


def test_tokens_are_created_listed_and_revoked_by_an_admin(api: Api) -> None:
    r = api.c.post("/v1/tokens", json={"name": "dash", "role": "read"}, headers=H)
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    assert r.json()["role"] == "read" and token not in api.tokens.read_text()  # shown once, stored hashed
    who = api.c.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()
    assert who == {"name": "dash", "role": "read"}
    listed = [t for p in api.pages("/v1/tokens", 2) for t in p]
    assert [(t["name"], t["role"]) for t in listed] == [("alice", "submit"), ("dash", "read"),
                                                        ("reader", "read")]
    assert "token" not in listed[0] and "sha256" not in listed[0]
    assert api.c.post("/v1/tokens", json={"name": "dash", "role": "read"}, headers=H).status_code == 409
    assert api.c.post("/v1/tokens", json={"name": "x", "role": "root"}, headers=H).status_code == 400
    assert api.c.post("/v1/tokens", json={"name": "a/b", "role": "read"}, headers=H).status_code == 400
    assert api.c.post("/v1/tokens", json={"name": "y", "role": "read"}, headers=api.alice).status_code == 403
    assert api.c.delete("/v1/tokens/dash", headers=H).json() == {"name": "dash", "revoked": True}
    assert api.c.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert api.c.delete("/v1/tokens/dash", headers=H).status_code == 404


def test_health_ready_config_openapi_and_docs_pages(api: Api) -> None:
    assert api.c.get("/health").json()["ok"] is True
    assert api.c.get("/ready").json() == {"ready": True, "role": "leader", "metadb": True,
                                          "version": api.c.get("/health").json()["version"]}
    api.s.role = "standby"
    r = api.c.get("/ready")
    assert r.status_code == 503 and r.json()["ready"] is False
    api.s.role = "leader"
    api.db.engine.dispose()
    api.db.engine.pool._creator = lambda *a: (_ for _ in ()).throw(OSError("down"))  # type: ignore[attr-defined]
    r = api.c.get("/ready")
    assert r.status_code == 503 and r.json()["metadb"] is False
    schema = api.c.get("/openapi.json").json()
    assert "/v1/jobs/{job}/tasks" in schema["paths"] and "/v1/nodes/{node}/drain" in schema["paths"]
    assert "TaskPage" in schema["components"]["schemas"]
    assert "swagger" in api.c.get("/docs").text.lower()


def test_a_live_tasks_drifts_name_the_node_left_and_the_node_reached() -> None:
    from triplane.scheduler.admin import _drifts
    from triplane.scheduler.dispatch.events import Transitioned

    log = [Transitioned("j", "t", "pending", "ready", 0, None, "sub", 0.0),
           Transitioned("j", "t", "ready", "dispatched", 0, "n1", "sub", 0.1),
           Transitioned("j", "t", "dispatched", "ready", 1, None, "tick-9", 2.0),
           Transitioned("j", "t", "ready", "dispatched", 1, "n2", "tick-10", 2.1),
           Transitioned("j", "t", "dispatched", "done", 1, "n2", "reply-3", 3.0)]
    assert _drifts(log) == [{"at": 2.0, "attempt": 1, "from": "n1", "to": "n2", "reason": "tick-9"}]


def test_engines_page_names_each_engines_binding(api: Api) -> None:
    from triplane.registry import Binding

    bound = Binding("n1", "numpy", "host")
    asyncio.run(api.registry.put(bound.key(), encode(bound)))
    pages = api.pages("/v1/engines", 1)
    assert [len(p) for p in pages] == [1, 1]
    assert [(e["node"], e["memory_engine"]) for p in pages for e in p] == [("n1", "host"), ("n2", None)]


def test_a_state_filter_sees_a_job_that_ended_a_moment_ago(api: Api) -> None:
    """A job's end reaches the metadb with the journal's next flush; a list filtered by
    state neither shows it under its old state nor leaves it out of its new one."""
    api.s.journal.open()  # the metadb writer of a started scheduler (its flush loop is not run)
    try:
        a, b = api.submit(), api.submit()
        assert api.c.post(f"/v1/jobs/{a}/cancel", headers=H).json()["state"] == "cancelled"
        running = api.c.get("/v1/jobs", params={"state": "running"}, headers=H).json()["items"]
        assert [(j["id"], j["state"]) for j in running] == [(b, "running")]
        cancelled = api.c.get("/v1/jobs", params={"state": "cancelled"}, headers=H).json()["items"]
        assert [(j["id"], j["state"]) for j in cancelled] == [(a, "cancelled")]
    finally:
        api.s.journal.writer.close()
