"""RemoteSession against a fake scheduler (httpx.MockTransport): the REST contract of
docs/runtime.md, upload caching, error mapping, retries and ``tp.connect`` resolution.
No sockets: the fake compiles and runs jobs in-process with the reference runner."""

from __future__ import annotations

import base64
import gc
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import triplane as tp
from triplane.embedded import EmbeddedSession
from triplane.proto import dtypes as dt
from triplane.proto.errors import KernelError, ShapeError
from triplane.proto.infer import graph_from_wire
from triplane.sdk import nn
from triplane.sdk.nn import functional as F
from triplane.sdk.remote import RemoteError, RemoteSession, connect, resolve_target
from triplane.sdk.session import current_session, set_default_session, use_session

TOKEN = "t0ken"
URL = "http://sched.test"


class FakeScheduler:
    """Just enough of the scheduler's REST API, computing with the reference runner."""

    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()
        self.fail_job: dict[str, Any] | None = None  # error body for the next job
        self.running_polls = 0  # /wait answers "running" this many times first
        self.submitted: list[dict[str, Any]] = []
        self.lose_fetches = 0  # fetches answered "its executor is gone" first
        self.lost_jobs: set[str] = set()  # their kept outputs died with an executor
        self.released: set[str] = set()  # jobs released (DELETE /v1/jobs/{id})
        self.copies = 0  # POST /v1/tensors/copy requests
        self.can_copy = True  # False: a scheduler that predates the copy request (405)
        self.knows_release = True  # False: a scheduler that predates a submit's "release" (400)
        self.carried = 0  # jobs released by a submit's "release"
        self.released_uploads: set[str] = set()  # uploads released by a submit's "release"
        self.refused_release = 0  # submits refused for their "release" (knows_release False)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        route = re.sub(r"/j[0-9a-f]+|/n\d+", "/*", path)
        self.calls[f"{request.method} {route}"] += 1
        if path == "/v1/health":
            return httpx.Response(200, json={"ok": True, "role": "leader", "version": "test"})
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"error": {"kind": "auth", "message": "missing or wrong token"}})
        if request.method == "GET" and path == "/v1/nodes":
            return httpx.Response(200, json={"items": [{"node": "executor-0", "pid": 1}], "next": None})
        if request.method == "POST" and path == "/v1/tensors":
            return self._upload(request)
        if request.method == "POST" and path == "/v1/tensors/copy":
            if not self.can_copy:
                return httpx.Response(405, json={"detail": "Method Not Allowed"})
            return self._copy(json.loads(request.content)["from"])
        m = re.fullmatch(r"/v1/jobs/(j\w+)", path)
        if m and request.method == "DELETE":
            self.released.add(m.group(1))
            self.jobs[m.group(1)].pop("_values", None)
            return httpx.Response(200, json={"id": m.group(1), "state": "done"})
        if request.method == "POST" and path == "/v1/jobs":
            body = json.loads(request.content)
            release = body.pop("release", [])
            if release and not self.knows_release:
                self.refused_release += 1
                return httpx.Response(400, json={"error": {"kind": "bad_request", "message": (
                    "unknown field(s) ['release'] (known: ['deadline_s', 'fetch', 'graph', ...])")}})
            r = self._submit(body)
            if r.status_code == 201:  # released once answered, as DELETE does
                for ident in release:
                    if ident.startswith("u-"):
                        self.released_uploads.add(ident)
                        continue
                    self.carried += 1
                    self.released.add(ident)
                    self.jobs[ident].pop("_values", None)
            return r
        m = re.fullmatch(r"/v1/jobs/(j\w+)/wait", path)
        if m:
            job = self.jobs[m.group(1)]
            if self.running_polls > 0:
                self.running_polls -= 1
                return httpx.Response(200, json={**self._public(job), "state": "running"})
            return httpx.Response(200, json=self._public(job))
        m = re.fullmatch(r"/v1/jobs/(j\w+)/tensors/(\w+)", path)
        if m and self.lose_fetches > 0:
            self.lose_fetches -= 1
            return httpx.Response(404, json={"error": {"kind": "not_found", "message": (
                f"tile {m.group(1)}.{m.group(2)} of tensor {m.group(2)!r} of job {m.group(1)} "
                "was held by node executor-0, which is gone")}})
        if m:
            arr = self.jobs[m.group(1)]["_values"][m.group(2)]
            return httpx.Response(200, content=arr.astype(arr.dtype.newbyteorder("<")).tobytes(),
                                  headers={"X-Triplane-Shape": ",".join(map(str, arr.shape)),
                                           "X-Triplane-Dtype": dt.dtype(arr.dtype).name})
        return httpx.Response(404, json={"error": {"kind": "not_found", "message": path}})

    @staticmethod
    def _public(job: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in job.items() if not k.startswith("_")}

    def _upload(self, request: httpx.Request) -> httpx.Response:
        d = dt.dtype(request.headers["X-Triplane-Dtype"])
        shape = tuple(int(s) for s in request.headers["X-Triplane-Shape"].split(",") if s)
        arr = np.frombuffer(request.content, dtype=d.np).reshape(shape)
        tid = f"u-{len(self.tensors):032x}"
        self.tensors[tid] = arr
        return httpx.Response(201, json={"id": tid, "shape": list(shape), "dtype": d.name,
                                         "bytes": len(request.content)})

    def _submit(self, body: dict[str, Any]) -> httpx.Response:
        from triplane.engines.registry import get_op_engine
        from triplane.executor.local import run_plan
        from triplane.scheduler.compiler.pipeline import compile_graph

        self.submitted.append(body)
        graph = graph_from_wire(body["graph"])  # as the scheduler reads it (nodes carry loc)
        try:
            plan = compile_graph(graph)
        except ShapeError as e:
            return httpx.Response(400, json={"error": {"kind": "shape", "message": str(e),
                                                       "node": e.node, "op": e.op}})
        bindings: dict[str, np.ndarray] = {}
        for n in graph.nodes.values():
            if n.op == "input":
                try:
                    bindings[n.attrs["tensor"]] = self._bound(n.attrs["tensor"])
                except LookupError as e:
                    return e.args[0]
        jid = f"j{len(self.jobs):016x}"
        job: dict[str, Any] = {"id": jid, "state": "done", "error": None,
                               "progress": {"done": len(graph), "total": len(graph)}}
        if self.fail_job is not None:
            job.update(state="failed", error=self.fail_job)
            self.fail_job = None
        else:
            values = run_plan(plan, bindings, get_op_engine("numpy"))
            job["_values"] = {k: v for k, v in values.items() if k in body["fetch"]}
        self.jobs[jid] = job
        if "wait_s" not in body or self.running_polls > 0:  # not ended within wait_s
            return httpx.Response(201, json={"id": jid, "state": "queued"})
        inline = {k: {"shape": list(v.shape), "dtype": dt.dtype(v.dtype).name,
                      "data": base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()}
                  for k, v in job.get("_values", {}).items() if k in body["inline"] and v.nbytes <= 65536}
        return httpx.Response(201, json={**self._public(job), "values": inline})

    def _bound(self, name: str) -> np.ndarray:
        """An upload or a ref's value; LookupError(response) as the scheduler answers."""
        if name.startswith("u-"):
            return self.tensors[name]
        job, node = name.split(":")
        if job in self.lost_jobs:
            raise LookupError(httpx.Response(410, json={"error": {
                "kind": "lost", "ref": name, "message": f"ref {name}: its executor is gone"}}))
        values = self.jobs.get(job, {}).get("_values")
        if values is None or node not in values:
            raise LookupError(httpx.Response(404, json={"error": {
                "kind": "not_found", "message": f"ref {name} is unknown or released"}}))
        return values[node]

    def _copy(self, refs: list[str]) -> httpx.Response:
        self.copies += 1
        ids = []
        for ref in refs:
            try:
                arr = self._bound(ref)
            except LookupError as e:
                return e.args[0]
            ids.append(f"u-{len(self.tensors):032x}")
            self.tensors[ids[-1]] = arr
        return httpx.Response(201, json={"ids": ids})


@pytest.fixture
def fake() -> FakeScheduler:
    return FakeScheduler()


@pytest.fixture
def remote(fake: FakeScheduler) -> RemoteSession:
    s = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), reconnect_s=1.0, poll_s=0.01)
    yield s
    s.close()


def _mlp_step(seed: int) -> list[tp.Tensor]:
    tp.manual_seed(seed)
    rng = np.random.default_rng(seed)
    x = tp.Tensor.from_array(rng.standard_normal((16, 4)).astype(np.float32))
    y = tp.Tensor.from_array(rng.standard_normal((16, 1)).astype(np.float32))
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    loss = F.mse_loss(model(x), y)
    grads = tp.grad(loss, list(model.parameters()))
    return [loss, *grads]


def test_an_output_lost_with_its_executor_is_computed_again(remote: RemoteSession,
                                                           fake: FakeScheduler) -> None:
    embedded = EmbeddedSession().evaluate(_mlp_step(4))
    remote.wait_s = 0  # outputs fetched after the job, not inline
    fake.lose_fetches = 1  # the executor holding the first output died after the job ended
    with use_session(remote):
        outs = _mlp_step(4)
        tp.realize(*outs)
        got = [o.numpy() for o in outs]
    assert len(fake.submitted) == 2  # the same job once more
    for g, w in zip(got, embedded, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_mlp_forward_backward_equals_embedded(remote: RemoteSession, fake: FakeScheduler) -> None:
    embedded = EmbeddedSession().evaluate(_mlp_step(3))
    remote.wait_s = 0  # the submit answers at once: wait, then fetch each output
    with use_session(remote):
        outs = _mlp_step(3)
        tp.realize(*outs)
        got = [o.numpy() for o in outs]
    assert len(got) == len(embedded) == 5
    for a, b in zip(got, embedded):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert fake.calls["POST /v1/jobs"] == 1
    # host data travelled once each: x, y and the four initialised parameters
    assert fake.calls["POST /v1/tensors"] == 6
    assert fake.calls["GET /v1/jobs/*/tensors/*"] == 5
    assert remote.last_stats["job"] == remote.last_job and remote.last_stats["uploaded"] == 6


def test_random_ops_and_reductions_equal_embedded(remote: RemoteSession) -> None:
    def build() -> list[tp.Tensor]:
        tp.manual_seed(11)
        a = tp.randn(5, 6)
        b = tp.rand(6)
        c = (a * b).sum(axis=0) + tp.max(a, axis=1).sum()
        return [c, tp.transpose(a).reshape(3, 10), tp.argmax(a, axis=1)]

    want = EmbeddedSession().evaluate(build())
    got = remote.evaluate(build())
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert not g.flags.writeable


def test_host_tensors_upload_once_and_the_cache_does_not_keep_them(remote: RemoteSession,
                                                                   fake: FakeScheduler) -> None:
    x = tp.Tensor.from_array(np.arange(12, dtype=np.float32).reshape(3, 4))
    remote.evaluate([(x * 2.0).sum()])
    remote.evaluate([(x + 1.0).sum()])
    assert fake.calls["POST /v1/tensors"] == 1
    assert len(remote._uploads) == 1
    x2 = tp.Tensor.from_array(np.ones((3, 4), dtype=np.float32))
    remote.evaluate([(x2 * x).sum()])
    assert fake.calls["POST /v1/tensors"] == 2
    del x, x2
    gc.collect()
    assert len(remote._uploads) == 0


def test_a_writable_array_edited_in_place_is_uploaded_again(fake: FakeScheduler) -> None:
    from triplane.sdk.lifecycle import Uploads

    ups = Uploads()
    arr = np.zeros(4)
    ups.put(arr, "u-1")
    assert ups.get(arr) == "u-1"
    arr[0] = 5.0
    assert ups.get(arr) is None
    assert ups.get(np.zeros(4)) is None  # another array with equal content is not a hit


def test_outputs_that_are_host_data_need_no_job(remote: RemoteSession, fake: FakeScheduler) -> None:
    x = tp.Tensor.from_array(np.arange(3.0))
    (v,) = remote.evaluate([x])
    np.testing.assert_array_equal(v, [0.0, 1.0, 2.0])
    assert fake.calls["POST /v1/jobs"] == 0


def test_bfloat16_and_zero_d_round_trip(remote: RemoteSession) -> None:
    x = tp.Tensor.from_array(np.array([1.5, -2.0, 3.25]), dtype=tp.bfloat16)
    s, y = remote.evaluate([(x * 2.0).sum(), x * 1.0])
    assert s.shape == () and y.dtype == tp.bfloat16.np
    np.testing.assert_array_equal(y.astype(np.float32), [1.5, -2.0, 3.25])


def test_wrong_token_is_a_clear_error(fake: FakeScheduler) -> None:
    s = RemoteSession(URL, "wrong", httpx.MockTransport(fake))
    with pytest.raises(RemoteError, match="refused the API token") as info:
        s.evaluate([tp.Tensor.from_array(np.ones(2)) * 2.0])
    assert info.value.status == 401 and "TRIPLANE_TOKEN" in str(info.value)


def test_a_failed_job_raises_kernel_error_naming_op_node_and_line(remote: RemoteSession,
                                                                  fake: FakeScheduler) -> None:
    x = tp.Tensor.from_array(np.ones((2, 2), dtype=np.float32))
    y = tp.log(x - 2.0)  # the line the error must point at
    fake.fail_job = {"kind": "user", "message": "node 'n3' (log): math domain error", "node": "n3",
                     "op": "log"}
    with pytest.raises(KernelError) as info:
        remote.evaluate([y])
    e = info.value
    assert e.kind == "user" and e.op == "log" and e.node == "n3"
    msg = str(e)
    assert msg.count("node 'n3' (log)") == 1 and "math domain error" in msg
    assert f"{__file__}:" in msg  # the user's line, found through the canonical renaming


def test_an_infra_failure_and_a_cancel(remote: RemoteSession, fake: FakeScheduler) -> None:
    x = tp.Tensor.from_array(np.ones(2))
    fake.fail_job = "every executor holding the inputs died"
    with pytest.raises(KernelError, match="every executor") as info:
        remote.evaluate([x * 3.0])
    assert info.value.kind == "infra"


def test_a_server_graph_error_maps_to_its_class(remote: RemoteSession, fake: FakeScheduler,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def bad(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            return httpx.Response(400, json={"error": {"kind": "shape", "node": "n2", "op": "matmul",
                                                       "message": "node 'n2' (matmul): (2, 3) @ (4, 5)"}})
        return fake(request)

    s = RemoteSession(URL, TOKEN, httpx.MockTransport(bad))
    with pytest.raises(ShapeError) as info:
        s.evaluate([tp.Tensor.from_array(np.ones(2)) * 2.0])
    assert info.value.node == "n2" and info.value.op == "matmul"
    assert str(info.value) == "node 'n2' (matmul): (2, 3) @ (4, 5)"


def test_long_poll_waits_until_done_and_job_timeout_bounds_it(remote: RemoteSession,
                                                              fake: FakeScheduler) -> None:
    fake.running_polls = 3
    (v,) = remote.evaluate([tp.Tensor.from_array(np.ones(2)) * 2.0])
    np.testing.assert_array_equal(v, [2.0, 2.0])
    assert fake.calls["GET /v1/jobs/*/wait"] == 4
    bounded = RemoteSession(URL, TOKEN, httpx.MockTransport(fake), job_timeout_s=0.05, poll_s=0.01)
    fake.running_polls = 10**6
    with pytest.raises(RemoteError, match="did not finish within"):
        bounded.evaluate([tp.Tensor.from_array(np.ones(2)) * 2.0])


def test_refused_connections_are_retried_then_reported(fake: FakeScheduler) -> None:
    refusals = {"left": 2}

    def flaky(request: httpx.Request) -> httpx.Response:
        if refusals["left"] > 0:
            refusals["left"] -= 1
            raise httpx.ConnectError("connection refused", request=request)
        return fake(request)

    s = RemoteSession(URL, TOKEN, httpx.MockTransport(flaky), reconnect_s=5.0)
    (v,) = s.evaluate([tp.Tensor.from_array(np.ones(2)) + 1.0])
    np.testing.assert_array_equal(v, [2.0, 2.0])

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    dead = RemoteSession(URL, TOKEN, httpx.MockTransport(down), reconnect_s=0.3)
    with pytest.raises(RemoteError, match=r"cannot reach the scheduler.*triplane status"):
        dead.evaluate([tp.Tensor.from_array(np.ones(2)) + 1.0])


def test_a_submit_that_may_have_arrived_is_not_sent_twice(fake: FakeScheduler) -> None:
    def reset_on_submit(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            fake.calls["POST /v1/jobs"] += 1
            raise httpx.ReadError("connection reset", request=request)
        return fake(request)

    s = RemoteSession(URL, TOKEN, httpx.MockTransport(reset_on_submit), reconnect_s=2.0)
    with pytest.raises(RemoteError, match="ReadError"):
        s.evaluate([tp.Tensor.from_array(np.ones(2)) + 1.0])
    assert fake.calls["POST /v1/jobs"] == 1


def test_a_fetched_tensor_of_the_wrong_size_is_refused(fake: FakeScheduler) -> None:
    def short(request: httpx.Request) -> httpx.Response:
        r = fake(request)
        if "/tensors/" in request.url.path and request.method == "GET":
            return httpx.Response(200, content=r.content[:-1], headers=r.headers)
        return r

    s = RemoteSession(URL, TOKEN, httpx.MockTransport(short), wait_s=0)
    with pytest.raises(RemoteError, match="bytes"):
        s.evaluate([tp.Tensor.from_array(np.ones(3)) + 1.0])


def test_an_inline_value_of_the_wrong_size_is_refused(fake: FakeScheduler) -> None:
    def short(request: httpx.Request) -> httpx.Response:
        r = fake(request)
        if request.url.path == "/v1/jobs" and request.method == "POST":
            body = r.json()
            for v in body["values"].values():
                v["data"] = base64.b64encode(base64.b64decode(v["data"])[:-1]).decode()
            return httpx.Response(201, json=body)
        return r

    s = RemoteSession(URL, TOKEN, httpx.MockTransport(short))
    with pytest.raises(RemoteError, match="bytes"):
        s.evaluate([tp.Tensor.from_array(np.ones(3)) + 1.0])


# --- tp.connect ------------------------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("TRIPLANE_URL", "TRIPLANE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRIPLANE_HOME", str(tmp_path / "home"))
    yield tmp_path / "home"
    set_default_session(None)


def test_connect_with_nothing_found_says_to_run_triplane_up(clean_env: Path) -> None:
    with pytest.raises(RemoteError, match="triplane up") as info:
        tp.connect()
    assert str(clean_env) in str(info.value)


def test_connect_reads_the_environment_then_the_run_dir(clean_env: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from triplane.launcher.rundir import RunDir

    run = RunDir(clean_env)
    run.create()
    token, _ = run.new_secrets()
    run.write_cluster({"url": "http://127.0.0.1:9999"})
    assert resolve_target() == ("http://127.0.0.1:9999", token)
    assert oct(run.token_file.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setenv("TRIPLANE_URL", "http://elsewhere:1")
    monkeypatch.setenv("TRIPLANE_TOKEN", "envtok")
    assert resolve_target() == ("http://elsewhere:1", "envtok")
    assert resolve_target("http://x:2", "argtok") == ("http://x:2", "argtok")
    # a URL without a token takes the run dir's token only for the run dir's own cluster
    monkeypatch.delenv("TRIPLANE_TOKEN")
    assert resolve_target("http://127.0.0.1:9999/") == ("http://127.0.0.1:9999/", token)
    assert resolve_target("http://other:1") == ("http://other:1", None)


def test_connect_sets_the_default_session_and_checks_the_token(clean_env: Path, fake: FakeScheduler) -> None:
    s = connect(URL, TOKEN, transport=httpx.MockTransport(fake))
    assert current_session() is s and tp.connect is connect
    np.testing.assert_array_equal((tp.Tensor.from_array(np.ones(2)) * 5.0).numpy(), [5.0, 5.0])
    assert fake.calls["POST /v1/jobs"] == 1
    set_default_session(None)
    with pytest.raises(RemoteError, match="refused the API token"):
        connect(URL, "nope", transport=httpx.MockTransport(fake))
    assert isinstance(current_session(), EmbeddedSession)


def test_a_malformed_cluster_json_is_no_cluster(clean_env: Path) -> None:
    clean_env.mkdir(parents=True)
    (clean_env / "cluster.json").write_text("{not json")
    with pytest.raises(RemoteError, match="triplane up"):
        resolve_target()
