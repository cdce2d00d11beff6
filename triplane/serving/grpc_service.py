"""The model server's gRPC front door, ``triplane.serving.v1.Predictor`` (``proto/serving.proto``):
``Predict`` and ``GetModel``, the HTTP routes ``/v1/predict`` and ``/v1/model`` over gRPC.

Tensors travel as raw little-endian bytes with their dtype and shape; each is checked
against the signature as over HTTP (the same ``check_inputs``), and a refusal ends the
call with the code of its kind (the scheduler's table, ``scheduler/grpc/status.py``:
INVALID_ARGUMENT naming the input, UNAUTHENTICATED, PERMISSION_DENIED,
RESOURCE_EXHAUSTED...). The caller's token is the metadata ``authorization: Bearer
<token>``; both calls take any client role, as their HTTP routes.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import TriplaneError
from triplane.scheduler.api.auth import ANYONE, NODE, Authenticator
from triplane.scheduler.errors import Forbidden
from triplane.scheduler.grpc.service import server_options
from triplane.scheduler.grpc.status import unary
from triplane.serving import serving_pb2 as pb
from triplane.serving import serving_pb2_grpc as pb_grpc
from triplane.serving.host import ModelHost
from triplane.serving.signature import Spec, decode_tensor

__all__ = ["PredictorService", "serve_grpc"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

def _tensor(arr: np.ndarray) -> pb.Tensor:
    d = dt.dtype(arr.dtype)
    return pb.Tensor(dtype=d.name, shape=list(arr.shape),
                     data=np.ascontiguousarray(arr, dtype=d.np.newbyteorder("<")).tobytes())


def _spec(s: Spec) -> pb.TensorSpec:
    return pb.TensorSpec(name=s.name, dtype=s.dtype, shape=[-1 if d is None else d for d in s.shape])


class PredictorService(pb_grpc.PredictorServicer):
    def __init__(self, host: ModelHost, auth: Authenticator) -> None:
        self.host, self.auth = host, auth

    def _caller(self, context: grpc.aio.ServicerContext) -> None:
        header = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
        p = self.auth.identify(header if isinstance(header, str) else None)
        if p.role not in ANYONE:
            who = "the node credential" if p.role == NODE else f"a {p.role} token ({p.name!r})"
            raise Forbidden(f"{who} may not use the model server (roles that may: {sorted(ANYONE)})")

    @unary
    async def Predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext
                      ) -> pb.PredictResponse:
        started = time.perf_counter()
        metrics = self.host.metrics
        try:
            self._caller(context)
            given = {name: decode_tensor(name, t.dtype, list(t.shape), t.data)
                     for name, t in request.inputs.items()}
            answer = await asyncio.wrap_future(self.host.predict(given))
        except TriplaneError as e:
            metrics.answered("grpc", e.kind, time.perf_counter() - started)
            raise
        v = self.host.current  # every version has the signature of the first (reload checks)
        assert v is not None
        metrics.answered("grpc", "ok", time.perf_counter() - started)
        return pb.PredictResponse(outputs={s.name: _tensor(o) for s, o in zip(v.outputs, answer.outputs)},
                                  model_version=answer.version)

    @unary
    async def GetModel(self, request: pb.ModelRequest, context: grpc.aio.ServicerContext) -> pb.ModelResponse:
        self._caller(context)
        v = self.host.current
        assert v is not None
        return pb.ModelResponse(inputs=[_spec(s) for s in v.inputs], outputs=[_spec(s) for s in v.outputs],
                                model_version=v.version)


async def serve_grpc(host: ModelHost, auth: Authenticator, address: str, port: int
                     ) -> tuple[grpc.aio.Server, int]:
    """Start ``Predictor`` on ``address:port`` (0: any free port) in the running loop;
    (the server, the port bound). OSError if the port cannot be bound."""
    server = grpc.aio.server(options=server_options(MAX_MESSAGE_BYTES), maximum_concurrent_rpcs=1024)
    pb_grpc.add_PredictorServicer_to_server(PredictorService(host, auth), server)
    try:
        bound = server.add_insecure_port(f"{address}:{port}")
    except RuntimeError as e:
        raise OSError(f"cannot listen for gRPC on {address}:{port}: {e}") from None
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address}:{port}")
    await server.start()
    return server, bound
