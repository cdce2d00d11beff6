"""The job submits' own connections (sdk/remote_wire.py) against a real HTTP server on
127.0.0.1: keep-alive reuse, a connection the server closed while idle, a refused
connection, 503 retries, error mapping, and when httpx carries the submits instead."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from triplane.proto import errors as E
from triplane.sdk.remote_errors import RemoteError
from triplane.sdk.remote_wire import Wire, wire_for


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_POST(self) -> None:
        srv = self.server
        close = srv.close_after  # (read before answering: the test changes it once answered)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        srv.seen.append((self.path, dict(self.headers), body, self.client_address[1]))
        status, answer = srv.answers.pop(0) if srv.answers else (200, {"echo": json.loads(body)})
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if close:
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.seen, srv.answers, srv.close_after = [], [], False
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _wire(srv, **kw) -> Wire:
    w = wire_for(f"http://127.0.0.1:{srv.server_address[1]}/", {"Authorization": "Bearer t"}, 2.0, 10.0)
    assert w is not None
    return w


def test_posts_reuse_one_kept_alive_connection_and_send_the_session_headers(server) -> None:
    w = _wire(server)
    for i in range(5):
        r = w.post("/v1/jobs", json.dumps({"i": i}).encode(), {"X-Triplane-Session": "s1"}, 1.0)
        assert r.status_code == 200 and r.json() == {"echo": {"i": i}}
    assert len({port for *_, port in server.seen}) == 1  # one connection for all five
    path, headers, _, _ = server.seen[0]
    assert path == "/v1/jobs"
    assert headers["Authorization"] == "Bearer t" and headers["X-Triplane-Session"] == "s1"
    w.close()


def test_a_connection_the_server_closed_while_idle_is_replaced(server) -> None:
    w = _wire(server)
    server.close_after = True  # the server closes after answering, without saying so first
    assert w.post("/x", b"{}", {}, 1.0).status_code == 200
    server.close_after = False
    time.sleep(0.05)
    assert w.post("/x", b"{}", {}, 1.0).status_code == 200  # not a reset: a new connection
    assert len({port for *_, port in server.seen}) == 2


def test_errors_map_as_on_httpx_and_503_is_retried(server) -> None:
    w = _wire(server)
    server.answers[:] = [(409, {"error": {"kind": "unknown_plan", "message": "unknown plan abc"}})]
    with pytest.raises(RemoteError) as e:
        w.post("/v1/jobs", b"{}", {}, 1.0)
    assert e.value.status == 409 and e.value.kind == "unknown_plan" and "unknown plan abc" in str(e.value)
    server.answers[:] = [(400, {"error": {"kind": "shape", "message": "bad shape", "node": "n3"}})]
    with pytest.raises(E.ShapeError, match="bad shape"):
        w.post("/v1/jobs", b"{}", {}, 1.0)
    server.answers[:] = [(503, {"error": "starting"}), (503, {"error": "starting"})]
    assert w.post("/v1/jobs", b"{}", {}, 2.0).status_code == 200  # after two 503s
    assert len(server.seen) == 5


def test_a_refused_connection_is_retried_then_reported() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = wire_for(f"http://127.0.0.1:{port}", {}, 0.5, 1.0)
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=r"cannot reach the scheduler at http://127\.0\.0\.1.*cluster up"):
        w.post("/v1/jobs", b"{}", {}, 0.3)
    assert 0.1 < time.monotonic() - t0 < 3.0  # retried with backoff, then reported


def test_a_server_that_dies_mid_request_is_reported_not_retried(server) -> None:
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]

    def accept_and_drop() -> None:
        conn, _ = lsock.accept()
        conn.recv(65536)
        conn.close()  # the request may have arrived: never sent twice

    t = threading.Thread(target=accept_and_drop, daemon=True)
    t.start()
    w = wire_for(f"http://127.0.0.1:{port}", {}, 1.0, 5.0)
    with pytest.raises(RemoteError, match="cannot reach the scheduler"):
        w.post("/v1/jobs", b"{}", {}, 5.0)
    t.join(5)
    lsock.close()


def test_httpx_carries_the_submits_for_https_a_transport_or_a_proxy(monkeypatch) -> None:
    assert wire_for("https://example.test", {}, 1.0, 1.0) is None
    assert wire_for("http://127.0.0.1:1", {}, 1.0, 1.0, transport=object()) is None
    monkeypatch.setenv("http_proxy", "http://proxy.test:3128")
    monkeypatch.setenv("no_proxy", "")
    assert wire_for("http://10.1.2.3:8080", {}, 1.0, 1.0) is None
    monkeypatch.setenv("no_proxy", "10.1.2.3")
    assert wire_for("http://10.1.2.3:8080", {}, 1.0, 1.0) is not None
