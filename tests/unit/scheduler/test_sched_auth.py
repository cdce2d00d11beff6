"""Who may do what on the REST API (docs/security.md): every route x every credential, the
ownership of a submit token's jobs, and the registry-poisoning attempt of issue 11.

No sockets: the app runs in memory over a Scheduler that is not started (jobs are accepted
and stay running; no executor runs them), as in test_sched_api.py."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from triplane import metadb as mdb
from triplane.registry import MemoryBackend, OpEngineInfo
from triplane.registry.credential import node_credential
from triplane.registry.http import HttpBackend, RegistryAuthError
from triplane.registry.records import encode
from triplane.registry.testing import run
from triplane.scheduler.api.app import create_app
from triplane.scheduler.api.auth import ROUTE_ROLES
from triplane.scheduler.api.tokens import add_token
from triplane.scheduler.service import Scheduler

ADMIN = "admin-token-0123456789"
SECRET = b"s" * 32
NODE = node_credential(SECRET)
CREDENTIALS = ("admin", "submit", "read", "none", "wrong", "node")


class Cluster:
    """A scheduler app with one token per role (submit tokens ``alice`` and ``bob``)."""

    def __init__(self, tmp_path: Path) -> None:
        self.registry = MemoryBackend()
        info = OpEngineInfo("ex1", "numpy", "numpy", "cpu", ("exp", "add"), ("float32",), 1.0, 1.0)
        asyncio.run(self.registry.put(info.key(), encode(info)))
        db = mdb.open_db(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
        self.scheduler = Scheduler(registry=self.registry, db=db, run_dir=tmp_path, secret=SECRET)
        tokens = tmp_path / "tokens.json"
        self.tokens = {
            "admin": ADMIN,
            "submit": add_token(tokens, "alice", "submit"),
            "bob": add_token(tokens, "bob", "submit"),
            "read": add_token(tokens, "reader", "read"),
            "node": NODE,
            "wrong": "not-a-token-of-this-cluster",
        }
        self.app = create_app(self.scheduler, ADMIN, tokens_file=tokens)
        self.client = TestClient(self.app)

    def headers(self, who: str) -> dict[str, str]:
        return {} if who == "none" else {"Authorization": f"Bearer {self.tokens[who]}"}

    def upload(self, who: str = "submit") -> str:
        arr = np.ones((2, 2), np.float32)
        headers = {**self.headers(who), "X-Triplane-Shape": "2,2", "X-Triplane-Dtype": "float32"}
        r = self.client.post("/v1/tensors", content=arr.tobytes(), headers=headers)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def submit(self, who: str = "submit") -> str:
        r = self.client.post("/v1/jobs", json=job_body(self.upload(who)), headers=self.headers(who))
        assert r.status_code == 201, r.text
        return r.json()["id"]


def job_body(u: str) -> dict:
    return {"graph": {"version": 1, "nodes": {
        "x": {"op": "input", "shape": [2, 2], "dtype": "float32",
              "attrs": {"tensor": u, "shape": [2, 2], "dtype": "float32"}},
        "y": {"op": "exp", "inputs": ["x"], "shape": [2, 2], "dtype": "float32"}}, "outputs": ["y"]},
        "fetch": ["y"]}


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def app_routes(app: object) -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves (HEAD aside), walking into
    included routers (FastAPI keeps them whole: ``original_router`` and its prefix)."""
    found: set[tuple[str, str]] = set()

    def walk(routes: list, prefix: str) -> None:
        for r in routes:
            inner = getattr(r, "original_router", None)
            if inner is not None:
                walk(inner.routes, prefix + r.include_context.prefix)
            else:
                found.update((m, prefix + r.path) for m in getattr(r, "methods", None) or () if m != "HEAD")

    walk(app.routes, "")  # type: ignore[attr-defined]
    return found


def test_every_route_is_in_the_role_table(cluster: Cluster) -> None:
    """auth.ROUTE_ROLES is the one table of who may call what: a route added without an
    entry fails here (and would answer 500, never open by default)."""
    missing = app_routes(cluster.app) - set(ROUTE_ROLES)
    assert not missing, f"routes missing from auth.ROUTE_ROLES: {sorted(missing)}"
    assert ("POST", "/v1/nodes/{node}/drain") in app_routes(cluster.app)  # the walk sees them


# Request bodies and query strings for the routes that need them to get past parsing.
QUERY = {"/v1/jobs/{job}/wait": "?timeout=0"}
FILL = {"job": "{job}", "upload": "{upload}", "sid": "{session}", "name": "y", "node": "ex1"}
BODIES: dict[tuple[str, str], dict] = {
    ("POST", "/v1/tensors/copy"): {"from": ["{job}:y"]},
    ("POST", "/v1/tokens"): {"name": "fresh", "role": "read"},
    **{("POST", f"/v1/registry/{op}"): body for op, body in {
        "put": {"key": "scheduler/data", "value": base64.b64encode(b"{}").decode()},
        "get": {"key": "scheduler/data"}, "get_prefix": {"prefix": ""}, "delete": {"key": "nodes/n1"},
        "delete_prefix": {"prefix": "nothing/"}, "create": {"key": "k1", "value": ""},
        "compare_and_swap": {"key": "k2", "value": ""}, "compare_and_delete": {"key": "k3"},
        "lease/grant": {"ttl_s": 5}, "lease/refresh": {"lease": 1}, "lease/ttl": {"lease": 1},
        "lease/revoke": {"lease": 1},
        "watch": {"prefix": "", "timeout_s": 0}}.items()},
}


def _request(c: Cluster, who: str, method: str, path: str, job: str, upload: str = "",
             session: str = "") -> httpx.Response:
    headers = c.headers(who)
    url = path
    for param, value in FILL.items():
        url = url.replace("{" + param + "}", value)
    url = url.format(job=job, upload=upload, session=session) + QUERY.get(path, "")
    if path == "/v1/tensors" and method == "POST":
        return c.client.post(url, content=bytes(16), headers={**headers, "X-Triplane-Shape": "2,2",
                                                              "X-Triplane-Dtype": "float32"})
    if path == "/v1/jobs" and method == "POST":
        return c.client.post(url, json=job_body(c.upload()), headers=headers)
    if path == "/v1/jobs#compiled-step":
        first = c.client.post("/v1/jobs", json=job_body(c.upload()), headers=c.headers("admin")).json()
        inline = {"shape": [2, 2], "dtype": "float32", "data": base64.b64encode(bytes(16)).decode()}
        return c.client.post("/v1/jobs", json={"plan": first["plan"], "args": [inline], "fetch": ["y"]},
                             headers=headers)
    body = BODIES.get((method, path))
    if body is not None:
        body = json.loads(json.dumps(body).replace("{job}", job))
        return c.client.request(method, url, json=body, headers=headers)
    return c.client.request(method, url, headers=headers)


@pytest.mark.parametrize("who", CREDENTIALS)
def test_role_matrix_every_route(cluster: Cluster, who: str) -> None:
    """Each route the app serves answers each credential as auth.ROUTE_ROLES says: allowed
    (no 401/403, no 5xx), 403 for a known credential whose role may not, 401 for none or a
    wrong one. A submit token calls with alice's job, upload and session (its own)."""
    job = cluster.submit("submit")  # alice's: the submit token here is alice's
    upload = cluster.upload("submit")
    session = cluster.client.post("/v1/sessions", headers=cluster.headers("submit")).json()["id"]
    served = app_routes(cluster.app)
    routes = [*sorted(served), ("POST", "/v1/jobs#compiled-step")]
    assert len(routes) >= 45
    for method, path in routes:
        allowed = ROUTE_ROLES[(method, path.partition("#")[0])]
        r = _request(cluster, who, method, path, job, upload, session)
        where = f"{who}: {method} {path} -> {r.status_code} {r.text[:200]}"
        if not allowed or who in allowed:
            assert r.status_code not in (401, 403), where
            assert r.status_code < 500, where
        elif who in ("none", "wrong"):
            assert r.status_code == 401, where
            assert r.headers["www-authenticate"] == "Bearer", where
        else:
            assert r.status_code == 403, where
            assert r.json()["error"]["kind"] == "forbidden", where


def test_whoami_names_the_principal(cluster: Cluster) -> None:
    for who, name, role in (("admin", "admin", "admin"), ("submit", "alice", "submit"),
                            ("read", "reader", "read")):
        assert cluster.client.get("/v1/whoami", headers=cluster.headers(who)).json() == \
            {"name": name, "role": role}


def test_a_submit_token_sees_and_cancels_only_its_own_jobs(cluster: Cluster) -> None:
    mine, theirs = cluster.submit("submit"), cluster.submit("bob")
    admins = cluster.submit("admin")
    c, alice = cluster.client, cluster.headers("submit")
    for path in ("/v1/jobs/{job}", "/v1/jobs/{job}/wait?timeout=0", "/v1/jobs/{job}/tensors/y",
                 "/v1/jobs/{job}/plan"):
        for other in (theirs, admins):
            r = c.get(path.format(job=other), headers=alice)
            assert r.status_code == 403 and r.json()["error"]["kind"] == "forbidden", (path, r.text)
        assert c.get(path.format(job=mine), headers=alice).status_code not in (401, 403)
    r = c.delete(f"/v1/jobs/{theirs}", headers=alice)
    assert r.status_code == 403
    assert c.get(f"/v1/jobs/{theirs}", headers=cluster.headers("bob")).json()["state"] == "running"
    assert [j["id"] for j in c.get("/v1/jobs", headers=alice).json()["items"]] == [mine]
    assert [j["id"] for j in c.get("/v1/jobs", headers=cluster.headers("bob")).json()["items"]] == [theirs]
    for who in ("admin", "read"):  # both see every job
        assert {j["id"] for j in c.get("/v1/jobs", headers=cluster.headers(who)).json()["items"]} == \
            {mine, theirs, admins}
    assert c.delete(f"/v1/jobs/{mine}", headers=alice).json()["state"] == "cancelled"
    assert c.delete(f"/v1/jobs/{theirs}", headers=cluster.headers("admin")).status_code == 200
    with cluster.scheduler.db.read() as s:
        assert mdb.get_job(s, mine).owner == "alice" and mdb.get_job(s, admins).owner == "admin"


def test_an_unknown_job_is_404_for_a_submit_token(cluster: Cluster) -> None:
    r = cluster.client.get("/v1/jobs/j0000000000000000", headers=cluster.headers("submit"))
    assert r.status_code == 404


def test_a_read_token_can_see_but_not_change(cluster: Cluster) -> None:
    job = cluster.submit("submit")
    c, reader = cluster.client, cluster.headers("read")
    assert c.get(f"/v1/jobs/{job}", headers=reader).json()["state"] == "running"
    assert c.delete(f"/v1/jobs/{job}", headers=reader).status_code == 403
    assert c.post("/v1/jobs", json=job_body(cluster.upload()), headers=reader).status_code == 403
    assert c.get(f"/v1/jobs/{job}", headers=reader).json()["state"] == "running"


def test_tokens_added_while_running_count_at_once_and_removed_ones_stop(cluster: Cluster,
                                                                        tmp_path: Path) -> None:
    from triplane.scheduler.api.tokens import remove_token

    late = add_token(tmp_path / "tokens.json", "late", "read")
    h = {"Authorization": f"Bearer {late}"}
    assert cluster.client.get("/v1/whoami", headers=h).json() == {"name": "late", "role": "read"}
    assert remove_token(tmp_path / "tokens.json", "late")
    assert cluster.client.get("/v1/whoami", headers=h).status_code == 401


def test_tokens_file_holds_hashes_only_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    token = add_token(path, "alice", "submit")
    text = path.read_text()
    assert token not in text and json.loads(text)["tokens"][0]["role"] == "submit"
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="exists already"):
        add_token(path, "alice", "read")
    with pytest.raises(ValueError, match="unknown role"):
        add_token(path, "carol", "root")
    with pytest.raises(ValueError, match="bad token name"):
        add_token(path, "a/b", "read")
    for reserved in ("admin", "node"):  # would share the owner name of the admin token / nodes
        with pytest.raises(ValueError, match="reserved"):
            add_token(path, reserved, "submit")


def test_registry_poisoning_with_a_client_token_is_refused(cluster: Cluster) -> None:
    """Issue 11: with the API token, PUT ``scheduler/data`` (where executors pull uploads
    from) to a fake server. Every client token gets 403 and the entry is unchanged; the node
    credential (executors, scheduler replicas) still writes."""
    real = json.dumps({"address": "127.0.0.1", "data_port": 4242}).encode()
    fake = json.dumps({"address": "203.0.113.9", "data_port": 6666}).encode()
    asyncio.run(cluster.registry.put("scheduler/data", real))
    transport = httpx.ASGITransport(app=cluster.app)

    async def attempt(token: str) -> None:
        async with HttpBackend("http://sched.test", token, transport=transport) as reg:
            await reg.put("scheduler/data", fake)

    for who in ("admin", "submit", "read"):
        with pytest.raises(RegistryAuthError, match="403") as e:
            run(attempt(cluster.tokens[who]), timeout_s=10)
        assert "client token cannot use the registry" in str(e.value)
        r = cluster.client.post("/v1/registry/delete", json={"key": "scheduler/data"},
                                headers=cluster.headers(who))
        assert r.status_code == 403
    entry = asyncio.run(cluster.registry.get("scheduler/data"))
    assert entry is not None and entry.value == real
    run(attempt(NODE), timeout_s=10)  # the node credential may
    assert asyncio.run(cluster.registry.get("scheduler/data")).value == fake
