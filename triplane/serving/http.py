"""The model server's HTTP API (FastAPI): predict, the model's signature, reload, metrics.

The request and response bodies of ``POST /v1/predict`` are pydantic models generated from
the model's signature (``signature.py``), so ``/openapi.json`` (and ``/docs``) types every
input: its element type, its rank and its fixed dimensions. Errors have the scheduler's
shape, ``{"error": {"kind", "message", ...}}``, and statuses (the same table,
``scheduler/api/errors.py``): an input of the wrong shape or dtype is 400 naming it, more
rows than one request may carry 413, a full queue 503.

Tokens and roles are the scheduler's (``tokens.json`` and the admin token,
``scheduler/api/auth.py``); :data:`ROUTE_ROLES` says who may call what (each route's
dependency reads it; a test checks that every route is listed): predicting and
reading the model or metrics takes any client token (``read`` included: a prediction
changes nothing on the cluster that the caller can see), a reload takes ``admin``.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the predict route's body
# type from its annotation, a class generated at run time.

import asyncio
import time
from typing import Any

import orjson
from fastapi import Depends, FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from triplane.proto.errors import TriplaneError
from triplane.scheduler.api.auth import ADMIN, ANYONE, PUBLIC, Authenticator, Principal
from triplane.scheduler.api.errors import install
from triplane.serving.host import ModelHost
from triplane.serving.signature import Spec, request_model, response_model

__all__ = ["ROUTE_ROLES", "make_app"]

ROUTE_ROLES: dict[tuple[str, str], tuple[str, ...]] = {
    ("GET", "/v1/health"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("GET", "/v1/model"): ANYONE,
    ("POST", "/v1/predict"): ANYONE,
    ("GET", "/metrics"): ANYONE,
    ("POST", "/v1/reload"): ADMIN,
}


class TensorSpecModel(BaseModel):
    name: str
    dtype: str
    shape: list[int | None] = Field(description="null for a dynamic dimension")


class ModelInfo(BaseModel):
    version: str
    path: str
    inputs: list[TensorSpecModel]
    outputs: list[TensorSpecModel]
    replicas: int
    max_batch: int
    max_wait_ms: float
    batching: bool


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(None, description="a model file to serve (default: the one served, re-read)")


class ReloadResponse(BaseModel):
    version: str
    previous: str


def _specs(specs: list[Spec]) -> list[TensorSpecModel]:
    return [TensorSpecModel(name=s.name, dtype=s.dtype, shape=list(s.shape)) for s in specs]


def make_app(host: ModelHost, auth: Authenticator) -> FastAPI:
    """The app over a started :class:`ModelHost`."""
    v = host.current
    assert v is not None, "start the host first"
    app = FastAPI(title="triplane model server", version="1",
                  description=f"Predictions of the model {v.path.name} (docs/serving.md).")
    install(app)
    metrics = host.metrics
    PredictRequest = request_model(v.inputs)
    PredictResponse = response_model(v.outputs)

    def may(method: str, path: str, what: str) -> Any:
        """The dependency that lets the roles of ROUTE_ROLES[(method, path)] call it."""
        return Depends(auth.require(ROUTE_ROLES[(method, path)], what))

    reads_model = may("GET", "/v1/model", "read the model")
    predicts = may("POST", "/v1/predict", "predict")
    reloads = may("POST", "/v1/reload", "reload the model")
    reads_metrics = may("GET", "/metrics", "read metrics")

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        cur = host.current
        return {"status": "ok", "model_version": cur.version if cur else None}

    @app.get("/v1/model", response_model=ModelInfo)
    async def model(_: Principal = reads_model) -> ModelInfo:
        cur = host.current
        assert cur is not None and host.batcher is not None
        return ModelInfo(version=cur.version, path=str(cur.path), inputs=_specs(cur.inputs),
                         outputs=_specs(cur.outputs), replicas=host.replicas, max_batch=host.max_batch,
                         max_wait_ms=host.max_wait_s * 1000, batching=host.batcher.batching)

    async def predict(body: PredictRequest,  # type: ignore[valid-type]
                      _: Principal = predicts) -> Any:
        started = time.perf_counter()
        try:
            inputs = body.inputs  # type: ignore[attr-defined]
            given = {name: getattr(inputs, name) for name in type(inputs).model_fields}
            answer = await asyncio.wrap_future(host.predict(given))
        except TriplaneError as e:
            metrics.answered("http", e.kind, time.perf_counter() - started)
            raise
        metrics.answered("http", "ok", time.perf_counter() - started)
        outputs = {s.name: o.tolist() for s, o in zip(v.outputs, answer.outputs)}  # one signature
        return Response(orjson.dumps({"outputs": outputs, "model_version": answer.version}),
                        media_type="application/json")

    predict.__annotations__["body"] = PredictRequest
    app.post("/v1/predict", response_model=PredictResponse,
             summary="Predict: the model's outputs for a batch of inputs")(predict)

    @app.post("/v1/reload", response_model=ReloadResponse)
    async def reload(body: ReloadRequest | None = None,
                     _: Principal = reloads) -> ReloadResponse:
        previous = host.current.version if host.current else ""
        new = await asyncio.to_thread(host.reload, body.path if body else None)
        return ReloadResponse(version=new.version, previous=previous)

    @app.get("/metrics")
    async def prometheus(_: Principal = reads_metrics) -> Response:
        return Response(metrics.render(lambda: len(host.batcher or ())),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
