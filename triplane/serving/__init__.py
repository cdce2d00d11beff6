"""Serving a model file: predict over HTTP and gRPC with dynamic batching, replicas,
metrics and reload (docs/serving.md).

``host.py`` (the versions in service, the replica threads, reload), ``batcher.py``
(dynamic batching), ``signature.py`` (inputs checked against the model's signature, the
pydantic models of the API), ``http.py`` and ``grpc_service.py`` (the two front doors,
``proto/serving.proto``), ``metrics.py`` (``/metrics``) and ``server.py`` (all of it on
one event loop). ``triplane serve`` and ``tp.serve`` (``triplane/cli_serve.py``) give it
the model loader and the sessions to run on.
"""

from triplane.serving.host import ModelHost, Version
from triplane.serving.server import ModelServer, ServeOptions

__all__ = ["ModelHost", "ModelServer", "ServeOptions", "Version"]
