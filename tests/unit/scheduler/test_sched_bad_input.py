"""Bad input at the front door (issue 11): each case is a 4xx naming what is wrong, never
a 500, a reset connection or a 503 from the metadb, and nothing is stored.

In memory (FastAPI's TestClient) over a Scheduler that is not started, as test_sched_api.py.
Server errors are answered, not raised, so a 500 shows as a 500 here."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from triplane import metadb as mdb
from triplane.proto.limits import MAX_ID_LENGTH, MAX_RANK
from triplane.registry import MemoryBackend, OpEngineInfo
from triplane.registry.records import encode
from triplane.scheduler.api.app import create_app
from triplane.scheduler.service import Scheduler

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(tmp_path: Path) -> tuple[Scheduler, TestClient]:
    reg = MemoryBackend()
    info = OpEngineInfo("ex1", "numpy", "numpy", "cpu", ("exp", "reshape"), ("float32",), 1.0, 1.0)
    asyncio.run(reg.put(info.key(), encode(info)))
    db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    s = Scheduler(registry=reg, db=db, run_dir=tmp_path, secret=b"s" * 32)
    return s, TestClient(create_app(s, TOKEN), raise_server_exceptions=False)


def _upload(c: TestClient) -> str:
    r = c.post("/v1/tensors", content=np.ones((2, 2), np.float32).tobytes(),
               headers={**AUTH, "X-Triplane-Shape": "2,2", "X-Triplane-Dtype": "float32"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _graph(u: str, out: str = "y") -> dict[str, Any]:
    return {"version": 1, "nodes": {
        "x": {"op": "input", "shape": [2, 2], "dtype": "float32",
              "attrs": {"tensor": u, "shape": [2, 2], "dtype": "float32"}},
        out: {"op": "exp", "inputs": ["x"], "shape": [2, 2], "dtype": "float32"}}, "outputs": [out]}


def _post(c: TestClient, body: bytes) -> Any:
    r = c.post("/v1/jobs", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    return r.status_code, json.loads(r.content.decode("utf-8"))["error"]  # the body is valid UTF-8 JSON


def _stored(s: Scheduler) -> int:
    with s.db.read() as session:
        return len(mdb.list_jobs(session, limit=100))


def _dumps(doc: Any) -> bytes:
    # json.dumps escapes a lone surrogate as \udfff, as a client's JSON would carry it.
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("node_id", "why"), [
    ("\udfff", "lone surrogate (U+DFFF)"),
    ("a\x00b", "control character (U+0000)"),
    ("a\tb", "control character (U+0009)"),
    ("a\x7fb", "control character (U+007F)"),
    ("a/b", "'/'"),
    ("..", "path step"),
    ("n" * (MAX_ID_LENGTH + 1), f"more than the limit of {MAX_ID_LENGTH}"),
])
def test_a_node_id_that_cannot_be_fetched_is_400_naming_it(api: tuple[Scheduler, TestClient],
                                                          node_id: str, why: str) -> None:
    s, c = api
    status, err = _post(c, _dumps({"graph": _graph(_upload(c), out=node_id), "fetch": [node_id]}))
    assert status == 400 and why in err["message"], err
    assert err["node"] == ascii(node_id[:80])[1:-1] or err["node"].endswith("..."), err
    assert err["kind"] == ("limit" if len(node_id) > MAX_ID_LENGTH else "graph")
    assert _stored(s) == 0


def test_a_nul_in_a_node_id_is_400_not_a_metadb_503(api: tuple[Scheduler, TestClient]) -> None:
    s, c = api
    status, err = _post(c, _dumps({"graph": _graph(_upload(c), out="y\x00")}))
    assert status == 400 and "U+0000" in err["message"] and "metadata DB" not in err["message"]
    assert _stored(s) == 0


@pytest.mark.parametrize("name", ["\udfff", "y\x00", "y/z", "\x1b[31m"])
def test_a_bad_fetched_name_is_400_naming_the_field(api: tuple[Scheduler, TestClient], name: str) -> None:
    s, c = api
    status, err = _post(c, _dumps({"graph": _graph(_upload(c)), "fetch": ["y", name]}))
    assert status == 400 and err["message"].startswith("fetch[1] "), err
    assert _stored(s) == 0


def test_lone_surrogates_anywhere_are_400_with_a_writable_body(api: tuple[Scheduler, TestClient]) -> None:
    s, c = api
    g = _graph(_upload(c))
    cases = []
    for path in (("nodes", "y", "op"), ("nodes", "y", "dtype"), ("nodes", "x", "attrs", "tensor")):
        doc = copy.deepcopy(g)
        where = doc
        for k in path[:-1]:
            where = where[k]
        where[path[-1]] = "\udfff"
        cases.append(doc)
    doc = copy.deepcopy(g)
    doc["nodes"]["y"]["inputs"] = ["\udfff"]
    cases.append(doc)
    for doc in cases:
        status, err = _post(c, _dumps({"graph": doc}))
        assert status == 400 and "\\udfff" in err["message"], err
    assert _stored(s) == 0


def test_more_dimensions_than_max_rank_are_refused_everywhere(api: tuple[Scheduler, TestClient]) -> None:
    s, c = api
    u = _upload(c)
    deep = [1] * (MAX_RANK - 2) + [2, 2]
    # declared on a node
    g = _graph(u)
    g["nodes"]["y"]["shape"] = [1] * 38 + [2, 2]
    status, err = _post(c, _dumps({"graph": g}))
    assert status == 400 and err["kind"] == "limit" and err["node"] == "y"
    assert f"40 dimensions, more than the limit of {MAX_RANK}" in err["message"]
    # made by an op (reshape) whose declared shape is consistent: validation infers it
    g = _graph(u)
    too_deep = [1] * (MAX_RANK - 1) + [2, 2]
    g["nodes"]["y"] = {"op": "reshape", "inputs": ["x"], "shape": too_deep, "dtype": "float32",
                       "attrs": {"shape": too_deep}}
    status, err = _post(c, _dumps({"graph": g}))
    assert status == 400 and err["kind"] == "limit" and f"limit of {MAX_RANK}" in err["message"], err
    assert err["node"] == "y" and err["op"] == "reshape", err
    # an upload
    r = c.post("/v1/tensors", content=np.ones(4, np.float32).tobytes(),
               headers={**AUTH, "X-Triplane-Shape": ",".join(["1"] * (MAX_RANK + 1) + ["4"]),
                        "X-Triplane-Dtype": "float32"})
    assert r.status_code == 400 and str(MAX_RANK) in r.json()["error"]["message"]
    assert _stored(s) == 0
    # MAX_RANK itself is fine
    g = _graph(u)
    g["nodes"]["y"] = {"op": "reshape", "inputs": ["x"], "shape": deep, "dtype": "float32",
                       "attrs": {"shape": deep}}
    r = c.post("/v1/jobs", json={"graph": g}, headers=AUTH)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("body", [
    b'{"graph": GRAPH, "fetch": ["y"], "fetch": ["x"]}',
    b'{"graph": GRAPH, "graph": GRAPH}',
    b'{"graph": {"version": 1, "version": 1, "nodes": {}, "outputs": []}}',
    b'{"graph": {"version": 1, "nodes": {"x": {"op": "exp", "op": "exp"}}, "outputs": ["x"]}}',
])
def test_duplicate_json_keys_are_400(api: tuple[Scheduler, TestClient], body: bytes) -> None:
    s, c = api
    status, err = _post(c, body.replace(b"GRAPH", _dumps(_graph(_upload(c)))))
    assert status == 400 and "duplicate key" in err["message"], err
    assert _stored(s) == 0


def test_nan_in_the_body_is_400(api: tuple[Scheduler, TestClient]) -> None:
    _, c = api
    status, err = _post(c, b'{"graph": {"version": NaN, "nodes": {}, "outputs": []}}')
    assert status == 400 and "NaN" in err["message"]
