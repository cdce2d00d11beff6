"""The model server over real HTTP and gRPC on loopback (the model run in-process, the
embedded session): predictions equal ``tp.load_model``'s, bad inputs are 4xx naming the
input, tokens and roles as the scheduler's, the OpenAPI document typed from the
signature, batching seen in /metrics, reload under load drops nothing, a bad reload
leaves the old version serving."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

import triplane as tp
from triplane.scheduler.api.tokens import add_token
from triplane.sdk import nn
from triplane.serving import serving_pb2 as pb
from triplane.serving import serving_pb2_grpc as pb_grpc

ADMIN = "admin-token-for-tests"


def _save(path: Path, width: int = 4, seed: int = 0) -> tp.Model:
    tp.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 3))
    tp.save_model(model, [np.zeros((2, width), np.float32)], path, names={"inputs": ["x"], "outputs": ["y"]})
    return tp.load_model(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, tp.Model, dict[str, str]]]:
    d = tmp_path_factory.mktemp("serve")
    model = _save(d / "m.tpm")
    tokens = d / "tokens.json"
    roles = {role: add_token(tokens, f"t-{role}", role) for role in ("submit", "read")}
    server = tp.serve(d / "m.tpm", embedded=True, port=0, grpc_port=0, replicas=2, max_batch=8,
                      max_wait_ms=20, admin_token=ADMIN, tokens_file=tokens, block=False)
    try:
        yield server, model, {"admin": ADMIN, **roles}
    finally:
        server.stop()


def _client(server: object, role: str, tokens: dict[str, str]) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {tokens[role]}"},  # type: ignore[attr-defined]
                        timeout=30)


def test_predict_matches_the_model_and_refuses_bad_inputs_by_name(served) -> None:  # type: ignore[no-untyped-def]
    server, model, tokens = served
    c = _client(server, "submit", tokens)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    r = c.post("/v1/predict", json={"inputs": {"x": x.tolist()}})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["outputs"]["y"]), model(x).numpy(), rtol=1e-6, atol=1e-6)
    assert r.json()["model_version"] == model.digest[:12]

    bad = {
        "shape": ({"x": [[1.0, 2.0, 3.0]]}, 400, "x"),
        "dtype": ({"x": {"shape": [1, 4], "dtype": "float64", "data": "A" * 43 + "="}}, 400,
                  "input 'x' has dtype float64"),
        "type": ({"x": [["a", 1, 2, 3]]}, 400, "inputs.x"),
        "missing": ({}, 400, "inputs.x"),
        "rows": ({"x": np.zeros((9, 4)).tolist()}, 413, "input 'x' has 9 rows"),
    }
    for what, (inputs, status, says) in bad.items():
        r = c.post("/v1/predict", json={"inputs": inputs})
        assert r.status_code == status, (what, r.text)
        assert says in r.json()["error"]["message"], (what, r.text)


def test_tokens_and_roles_are_the_schedulers(served) -> None:  # type: ignore[no-untyped-def]
    server, _, tokens = served
    x = {"inputs": {"x": [[0.0, 1.0, 2.0, 3.0]]}}
    assert httpx.post(f"{server.url}/v1/predict", json=x).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{server.url}/v1/predict", json=x, headers=wrong).status_code == 401
    assert httpx.get(f"{server.url}/v1/health").status_code == 200
    for role in ("admin", "submit", "read"):
        assert _client(server, role, tokens).post("/v1/predict", json=x).status_code == 200, role
    r = _client(server, "read", tokens).post("/v1/reload")
    assert r.status_code == 403 and "reload" in r.json()["error"]["message"]
    assert _client(server, "submit", tokens).post("/v1/reload").status_code == 403


def test_every_route_is_in_the_role_table(served) -> None:  # type: ignore[no-untyped-def]
    from triplane.serving.http import ROUTE_ROLES

    routes = {(m, r.path) for r in served[0].app.routes for m in getattr(r, "methods", ()) if m != "HEAD"}
    assert routes - set(ROUTE_ROLES) == set(), "routes missing from ROUTE_ROLES"
    assert ROUTE_ROLES[("POST", "/v1/reload")] == ("admin",)


def test_openapi_is_typed_from_the_signature(served) -> None:  # type: ignore[no-untyped-def]
    server, _, tokens = served
    schemas = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
    x = schemas["PredictInputs"]["properties"]["x"]["anyOf"][0]
    assert x["items"]["minItems"] == x["items"]["maxItems"] == 4 and x["items"]["items"]["type"] == "number"
    assert "y" in schemas["PredictOutputs"]["properties"]
    info = _client(server, "read", tokens).get("/v1/model").json()
    assert info["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, 4]}] and info["batching"]


def test_grpc_predict_and_its_errors(served) -> None:  # type: ignore[no-untyped-def]
    server, model, tokens = served
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    with grpc.insecure_channel(server.grpc_address) as ch:
        stub = pb_grpc.PredictorStub(ch)
        meta = (("authorization", f"Bearer {tokens['read']}"),)
        req = pb.PredictRequest(inputs={"x": pb.Tensor(dtype="float32", shape=[2, 4], data=x.tobytes())})
        rep = stub.Predict(req, metadata=meta, timeout=30)
        y = np.frombuffer(rep.outputs["y"].data, np.float32).reshape(tuple(rep.outputs["y"].shape))
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-6, atol=1e-6)
        assert list(stub.GetModel(pb.ModelRequest(), metadata=meta).inputs[0].shape) == [-1, 4]
        wrong = pb.PredictRequest(inputs={"x": pb.Tensor(dtype="int32", shape=[2, 4], data=x.tobytes())})
        with pytest.raises(grpc.RpcError) as e:
            stub.Predict(wrong, metadata=meta, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "input 'x'" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Predict(req, timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_concurrent_requests_are_batched_and_a_reload_drops_none(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, model, tokens = served
    admin = _client(server, "admin", tokens)
    before = admin.get("/metrics").text
    new = _save(tmp_path / "v2.tpm", seed=5)  # same signature, other weights
    xs = np.random.default_rng(3).standard_normal((96, 1, 4)).astype(np.float32)
    reloaded = threading.Event()

    def one(i: int) -> tuple[int, str, float]:
        if i == 40:
            r = admin.post("/v1/reload", json={"path": str(tmp_path / "v2.tpm")})
            assert r.status_code == 200, r.text
            reloaded.set()
        if i >= 80:  # the last ones after the reload: they must meet the new version
            assert reloaded.wait(60)
        with _client(server, "submit", tokens) as c:
            r = c.post("/v1/predict", json={"inputs": {"x": xs[i].tolist()}})
        if r.status_code != 200:
            return r.status_code, r.text, 0.0
        body = r.json()
        want = (new if body["model_version"] == new.digest[:12] else model)(xs[i]).numpy()
        return 200, body["model_version"], float(np.abs(np.array(body["outputs"]["y"]) - want).max())

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(len(xs))))
    assert [r for r in results if r[0] != 200] == []
    assert max(r[2] for r in results) < 1e-5
    versions = {r[1] for r in results}
    assert reloaded.is_set() and new.digest[:12] in versions
    after = admin.get("/metrics").text
    batches, rows = (_metric(after, f"triplane_serve_batch_rows_{s}")
                     - _metric(before, f"triplane_serve_batch_rows_{s}") for s in ("count", "sum"))
    assert rows >= 96 and batches < rows, f"{rows} rows in {batches} batches: no batching"
    assert _metric(after, 'triplane_serve_request_seconds_count{protocol="http"}') >= 96
    assert f'triplane_serve_model_info{{version="{new.digest[:12]}"}} 1.0' in after

    # a file that does not load, or of another signature: 409, the version in service stays
    (tmp_path / "bad.tpm").write_bytes(b"not a model")
    r = admin.post("/v1/reload", json={"path": str(tmp_path / "bad.tpm")})
    assert r.status_code == 409 and "not_a_model" in r.json()["error"]["message"], r.text
    _save(tmp_path / "wide.tpm", width=5)
    r = admin.post("/v1/reload", json={"path": str(tmp_path / "wide.tpm")})
    assert r.status_code == 409 and "another signature" in r.json()["error"]["message"], r.text
    assert admin.get("/v1/model").json()["version"] == new.digest[:12]
