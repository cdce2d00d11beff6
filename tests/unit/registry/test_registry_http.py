"""The HTTP-served registry without sockets: server and client joined by httpx.ASGITransport.

The conformance suite runs here against HttpBackend -> RegistryServer -> MemoryBackend;
the same suite over real loopback sockets (uvicorn) is in tests/integration/registry.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi", reason="the served registry needs fastapi (pip install 'triplane[cluster]')")
from fastapi import FastAPI

from triplane.registry import (
    LeaseNotFound,
    MemoryBackend,
    MemoryStore,
    RegistryBackend,
    RegistryError,
    RegistryUnavailable,
    connect_registry,
)
from triplane.registry.credential import node_credential
from triplane.registry.http import HttpBackend, RegistryAuthError, RegistryServer, registry_router
from triplane.registry.testing import NodeRegistryConformance, RegistryBackendConformance, run

TOKEN = "unit-test-token"
BASE = "http://registry.test"
_prefixes = itertools.count()


def _app(server: RegistryServer) -> FastAPI:
    app = FastAPI()
    app.include_router(server.router)
    return app


class AsgiHarness:
    """One served MemoryStore; each client talks to it through the ASGI app, no sockets."""

    def __init__(self) -> None:
        self.backend = MemoryBackend(MemoryStore(), prefix=f"/served{next(_prefixes)}/")
        self.server = RegistryServer(self.backend, TOKEN)
        self.app = _app(self.server)

    def client(self, token: str = TOKEN, **kw: Any) -> HttpBackend:
        return HttpBackend(BASE, token, transport=httpx.ASGITransport(app=self.app), poll_s=2, **kw)


class TestHttpConformance(RegistryBackendConformance, NodeRegistryConformance):
    @pytest.fixture
    def registry_harness(self) -> Iterator[AsgiHarness]:
        yield AsgiHarness()


@pytest.fixture
def harness() -> AsgiHarness:
    return AsgiHarness()


async def _raw(h: AsgiHarness, path: str, body: bytes | object, token: str | None = TOKEN) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app), base_url=BASE) as c:
        return await c.post(f"/v1/registry/{path}", content=content, headers=headers)


def test_wrong_or_missing_token_is_401_and_changes_nothing(harness: AsgiHarness) -> None:
    async def body() -> None:
        for token in (None, "", "wrong-token", TOKEN + "x"):
            resp = await _raw(harness, "put", {"key": "k", "value": "dg=="}, token=token)
            assert resp.status_code == 401, token
            assert resp.json()["error"]["kind"] == "auth"
            assert resp.headers["www-authenticate"] == "Bearer"
        async with harness.client(token="wrong-token") as bad:
            with pytest.raises(RegistryAuthError, match="wrong node credential"):
                await bad.put("k", b"v")
            with pytest.raises(RegistryAuthError):
                await bad.watch_prefix("").start()
        assert await harness.backend.get_prefix("") == []
    run(body(), timeout_s=10)


@pytest.mark.parametrize(("path", "payload", "message"), [
    ("put", b"{not json", "not valid JSON"),
    ("put", b"[" * 200_000, "not valid JSON"),  # nesting bomb: RecursionError, still a 400
    ("put", b"\xff\xfe\x00", "not valid JSON"),
    ("put", ["key", "value"], "must be a JSON object"),
    ("put", {"key": "k"}, "missing field 'value'"),
    ("put", {"value": "dg=="}, "missing field 'key'"),
    ("put", {"key": "k", "value": "not base64!"}, "not valid base64"),
    ("put", {"key": "k", "value": 12}, "must be a base64 string"),
    ("put", {"key": "", "value": "dg=="}, "must not be empty"),
    ("put", {"key": 5, "value": "dg=="}, "keys are str"),
    ("put", {"key": "a\u0000b", "value": "dg=="}, "NUL"),
    ("put", {"key": "k", "value": "dg==", "lease": -1}, "'lease' must be an integer"),
    ("put", {"key": "k", "value": "dg==", "lease": True}, "'lease' must be an integer"),
    ("put", {"key": "k", "value": "dg==", "colour": "red"}, "unknown field"),
    ("lease/grant", {"ttl_s": 0}, "positive"),
    ("lease/grant", {"ttl_s": "5"}, "number of seconds"),
    ("lease/grant", {}, "missing field 'ttl_s'"),
    ("compare_and_swap", {"key": "k", "value": "dg=="}, "expected_value and/or expected_version"),
    ("watch", {"prefix": "", "after": 0}, "'epoch'"),
    ("watch", {"prefix": "", "after": 0, "epoch": "e", "timeout_s": float("nan")}, "non-negative number"),
])
def test_malformed_requests_are_400_with_a_clear_message(harness: AsgiHarness, path: str, payload: Any,
                                                         message: str) -> None:
    async def body() -> None:
        resp = await _raw(harness, path, payload)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["kind"] == "bad_request"
        assert message in resp.json()["error"]["message"]
        # The server keeps serving and nothing was stored.
        ok = await _raw(harness, "put", {"key": "after", "value": base64.b64encode(b"ok").decode()})
        assert ok.status_code == 200
        assert [e.key for e in await harness.backend.get_prefix("")] == ["after"]
    run(body(), timeout_s=10)


def test_oversized_body_is_413(harness: AsgiHarness) -> None:
    async def body() -> None:
        big = {"key": "k", "value": base64.b64encode(b"x" * (1 << 20)).decode()}
        resp = await _raw(harness, "put", big)
        assert resp.status_code == 413 and resp.json()["error"]["kind"] == "too_large"
        assert await harness.backend.get("k") is None
    run(body(), timeout_s=10)


def test_unknown_lease_is_404_and_lease_not_found_on_the_client(harness: AsgiHarness) -> None:
    async def body() -> None:
        resp = await _raw(harness, "put", {"key": "k", "value": "dg==", "lease": 12345})
        assert resp.status_code == 404 and resp.json()["error"]["kind"] == "lease_not_found"
        async with harness.client() as r:
            with pytest.raises(LeaseNotFound):
                await r.put("k", b"v", lease=12345)
            with pytest.raises(LeaseNotFound):
                await r.refresh_lease(12345)
            assert await r.revoke_lease(12345) is False
            assert await r.get("k") is None
    run(body(), timeout_s=10)


def test_bad_arguments_fail_on_the_client_before_sending() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    async def body() -> None:
        async with HttpBackend(BASE, TOKEN, transport=httpx.MockTransport(handler)) as r:
            with pytest.raises(ValueError):
                await r.put("", b"v")
            with pytest.raises(TypeError):
                await r.put("k", "text")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await r.put("k", b"v", lease=-3)
            with pytest.raises(ValueError):
                await r.compare_and_swap("k", b"v")
            with pytest.raises(ValueError):
                await r.grant_lease(0)
        assert sent == []
    run(body(), timeout_s=5)
    with pytest.raises(ValueError, match="node credential"):
        HttpBackend(BASE, "")
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        HttpBackend("ftp://x", TOKEN)


def test_unreachable_and_broken_servers_raise_registry_errors() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"<html>proxy page</html>")

    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"kind": "unavailable", "message": "etcd down"}})

    async def body() -> None:
        async with HttpBackend(BASE, TOKEN, transport=httpx.MockTransport(down), timeout_s=0.2) as r:
            with pytest.raises(RegistryUnavailable, match="unreachable"):
                await r.get("k")
            with pytest.raises(RegistryUnavailable):
                await r.watch_prefix("").start()
        async with HttpBackend(BASE, TOKEN, transport=httpx.MockTransport(garbage)) as r:
            with pytest.raises(RegistryError, match="malformed answer"):
                await r.get("k")
        async with HttpBackend(BASE, TOKEN, transport=httpx.MockTransport(busy)) as r:
            with pytest.raises(RegistryUnavailable, match="etcd down"):
                await r.put("k", b"v")
    run(body(), timeout_s=5)


def test_watch_rides_out_a_short_outage_and_resumes_from_its_revision(harness: AsgiHarness) -> None:
    """Polls that fail with transport errors are retried from the same revision: nothing lost."""
    asgi = httpx.ASGITransport(app=harness.app)
    state = {"down": False}

    class Flaky(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if state["down"]:
                raise httpx.ReadError("connection reset", request=request)
            return await asgi.handle_async_request(request)

    async def body() -> None:
        async with HttpBackend(BASE, TOKEN, transport=Flaky(), poll_s=0.2, timeout_s=2) as r, \
                harness.client() as writer, r.watch_prefix("x/") as events:
            await writer.put("x/1", b"a")
            assert (await asyncio.wait_for(anext(events), 5)).key == "x/1"
            state["down"] = True
            reader = asyncio.create_task(anext(events))
            await asyncio.sleep(0.5)  # the poll is failing and retrying now
            await writer.put("x/2", b"b")
            await writer.delete("x/1")
            state["down"] = False
            got = [await asyncio.wait_for(reader, 5), await asyncio.wait_for(anext(events), 5)]
            assert [(e.kind, e.key) for e in got] == [("put", "x/2"), ("delete", "x/1")]
    run(body(), timeout_s=15)


def test_watch_gives_up_after_a_long_outage() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/watch") and b'"after"' not in request.content:
            return httpx.Response(200, json={"events": [], "revision": 3, "epoch": "e1"})
        raise httpx.ConnectError("connection refused", request=request)

    async def body() -> float:
        r = HttpBackend(BASE, TOKEN, transport=httpx.MockTransport(down), timeout_s=0.3)
        async with r, r.watch_prefix("") as events:
            start = asyncio.get_running_loop().time()
            with pytest.raises(RegistryUnavailable):
                await anext(events)
            return asyncio.get_running_loop().time() - start
    took = run(body(), timeout_s=10)
    assert 0.8 <= took < 3.0  # 3 x timeout_s of retries, then up to the caller (re-list)


def test_a_restarted_server_loses_history_and_the_watch_says_so() -> None:
    """A new RegistryServer (a restarted scheduler) has a new epoch: 410 -> RegistryUnavailable,
    even when the new store's revision has already passed the old one."""
    old = AsgiHarness()
    new = AsgiHarness()
    current = {"app": old.app}

    class Switch(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return await httpx.ASGITransport(app=current["app"]).handle_async_request(request)

    async def body() -> None:
        r = HttpBackend(BASE, TOKEN, transport=Switch(), poll_s=0.3)
        async with r, r.watch_prefix("") as events:
            await r.put("k", b"1")
            assert (await asyncio.wait_for(anext(events), 5)).key == "k"
            for i in range(5):  # the new store runs ahead of the old revision
                await new.backend.put(f"n{i}", b"x")
            current["app"] = new.app
            with pytest.raises(RegistryUnavailable, match="history was lost"):
                await asyncio.wait_for(anext(events), 5)
    run(body(), timeout_s=10)


def test_close_answers_pending_polls_at_once(harness: AsgiHarness) -> None:
    async def body() -> None:
        start = await _raw(harness, "watch", {"prefix": ""})
        epoch, rev = start.json()["epoch"], start.json()["revision"]
        poll = asyncio.create_task(_raw(harness, "watch", {"prefix": "", "after": rev, "epoch": epoch,
                                                           "timeout_s": 30}))
        await asyncio.sleep(0.2)
        assert not poll.done()
        await harness.server.close()
        resp = await asyncio.wait_for(poll, 2)
        assert resp.status_code == 200 and resp.json()["events"] == []
    run(body(), timeout_s=10)


def test_old_revisions_beyond_the_log_are_410() -> None:
    async def body() -> None:
        backend = MemoryBackend()
        server = RegistryServer(backend, TOKEN, log_size=2)
        h = AsgiHarness()
        h.backend, h.server, h.app = backend, server, _app(server)
        start = (await _raw(h, "watch", {"prefix": ""})).json()
        for i in range(6):
            await backend.put(f"k{i}", b"v")
        await asyncio.sleep(0.05)  # let the log's pump catch up and trim
        resp = await _raw(h, "watch", {"prefix": "", "after": start["revision"], "epoch": start["epoch"]})
        assert resp.status_code == 410 and "older than the watch log" in resp.json()["error"]["message"]
        recent = await _raw(h, "watch", {"prefix": "", "after": start["revision"] + 4,
                                         "epoch": start["epoch"]})
        assert [e["key"] for e in recent.json()["events"]] == ["k4", "k5"]
    run(body(), timeout_s=10)


def test_connect_registry_http_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    r = connect_registry("http://127.0.0.1:8470", token="t0k")
    assert isinstance(r, HttpBackend) and r.url == "http://127.0.0.1:8470" and r.prefix == ""
    # Without a token, the node credential is derived from the cluster secret.
    monkeypatch.setenv("TRIPLANE_SECRET", "s" * 32)
    monkeypatch.setenv("TRIPLANE_TOKEN", "a-client-token-is-never-used")
    r = connect_registry("https://reg.example:443/", prefix="/mine/")
    assert isinstance(r, HttpBackend) and r._token == node_credential("s" * 32) and r.prefix == "/mine/"
    r = connect_registry("http://127.0.0.1:8470", secret=b"t" * 32)
    assert r._token == node_credential(b"t" * 32) != node_credential(b"s" * 32)
    # Other schemes ignore a token, so callers may always pass theirs.
    assert isinstance(connect_registry("memory://", token="t0k"), MemoryBackend)
    monkeypatch.delenv("TRIPLANE_SECRET")
    with pytest.raises(ValueError, match="TRIPLANE_SECRET"):
        connect_registry("http://127.0.0.1:8470")


def test_node_credential_is_derived_one_way_from_the_secret() -> None:
    import hashlib
    import hmac

    secret = b"cluster-secret-0123456789"
    cred = node_credential(secret)
    assert cred == hmac.new(secret, b"triplane-node-credential", hashlib.sha256).hexdigest()
    assert len(cred) == 64 and cred == node_credential("cluster-secret-0123456789")
    with pytest.raises(ValueError):
        node_credential(b"")


def test_a_recognised_client_token_is_403_a_wrong_one_401() -> None:
    backend = MemoryBackend()
    server = RegistryServer(backend, TOKEN, is_client_token=lambda t: t == "client-token")
    app = FastAPI()
    app.include_router(server.router)

    async def body() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
            for token, status in (("client-token", 403), ("other", 401), (TOKEN, 200)):
                resp = await c.post("/v1/registry/put", json={"key": "k", "value": "dg=="},
                                    headers={"Authorization": f"Bearer {token}"})
                assert resp.status_code == status, token
            assert resp.status_code == 200
        async with HttpBackend(BASE, "client-token", transport=httpx.ASGITransport(app=app)) as r:
            with pytest.raises(RegistryAuthError, match="403"):
                await r.put("k", b"poison")
        assert (await backend.get("k")).value == b"v"
    run(body(), timeout_s=10)


def test_registry_router_needs_a_token() -> None:
    with pytest.raises(ValueError, match="token"):
        registry_router(MemoryBackend(), "")
    paths = {route.path for route in registry_router(MemoryBackend(), TOKEN).routes}  # type: ignore[attr-defined]
    assert {"/v1/registry/put", "/v1/registry/watch", "/v1/registry/lease/grant"} <= paths


def test_is_a_registry_backend() -> None:
    assert issubclass(HttpBackend, RegistryBackend)
