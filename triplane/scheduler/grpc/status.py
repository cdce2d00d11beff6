"""The one table from an error's ``kind`` to its gRPC status code, and how a refused call ends.

The REST API maps the same kinds to HTTP statuses (``api/errors.py``, ``STATUS``); a test
checks that both tables know the same kinds. A call that fails ends with the code of its
error's kind, the error's message as the status details, and the REST API's error body
(``{"kind", "message", "node", "op"}``, JSON) in the trailing metadata ``triplane-error``.
A kind missing from the table is a bug: it answers ``INTERNAL`` and is logged, as REST's 500.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from triplane.metadb import MetaDBError
from triplane.proto.dataport import DataPortError
from triplane.proto.errors import TriplaneError
from triplane.scheduler.errors import error_body

__all__ = ["CODE", "ERROR_KEY", "abort", "code_of", "error_of", "unary"]

log = logging.getLogger(__name__)

ERROR_KEY = "triplane-error"  # trailing metadata: the REST error body as JSON

C = grpc.StatusCode
# kind -> gRPC status code: the only place a code is chosen for a domain error.
CODE: dict[str, grpc.StatusCode] = {
    # the graph or the request is wrong (the body names the node and op)
    "request": C.INVALID_ARGUMENT, "graph": C.INVALID_ARGUMENT, "shape": C.INVALID_ARGUMENT,
    "dtype": C.INVALID_ARGUMENT, "attr": C.INVALID_ARGUMENT, "limit": C.INVALID_ARGUMENT,
    "unknown_op": C.INVALID_ARGUMENT, "placement": C.INVALID_ARGUMENT,
    "not_differentiable": C.INVALID_ARGUMENT,
    "model_file": C.INVALID_ARGUMENT, "not_a_model": C.INVALID_ARGUMENT, "truncated": C.INVALID_ARGUMENT,
    "corrupted": C.INVALID_ARGUMENT, "unsupported_version": C.INVALID_ARGUMENT,
    "unsigned": C.INVALID_ARGUMENT, "bad_signature": C.INVALID_ARGUMENT, "tampered": C.INVALID_ARGUMENT,
    "unauthorized": C.UNAUTHENTICATED,
    "forbidden": C.PERMISSION_DENIED,
    "not_found": C.NOT_FOUND,
    "method_not_allowed": C.UNIMPLEMENTED,
    # the call contradicts the job's state: retrying the same call does not help until it changes
    "not_ready": C.FAILED_PRECONDITION, "conflict": C.FAILED_PRECONDITION,
    "unknown_plan": C.FAILED_PRECONDITION,
    "lost": C.DATA_LOSS,  # REST 410: the executor holding a ref's value is gone with it
    "too_large": C.RESOURCE_EXHAUSTED,  # as gRPC's own answer to a message over its bound
    "internal": C.INTERNAL,
    "unavailable": C.UNAVAILABLE, "standby": C.UNAVAILABLE,
}


def code_of(kind: str) -> grpc.StatusCode:
    """The gRPC code of an error ``kind`` (``INTERNAL`` for a kind the table does not know)."""
    return CODE.get(kind, C.INTERNAL)


def error_of(e: BaseException) -> dict[str, Any]:
    """The REST error body of any exception a call may raise: a domain error's own; the
    metadb or a data port out of reach is ``unavailable``; anything else is ``internal``
    and says nothing of its insides (the scheduler log has it)."""
    if isinstance(e, DataPortError):  # a fetch's holder went away or refused (REST: mid-stream)
        return {"kind": "unavailable", "message": f"data port: {e}", "node": None, "op": None}
    if isinstance(e, MetaDBError):  # a TriplaneError too: REST's handler for it is the more specific
        return {"kind": "unavailable", "message": f"metadata DB: {e}", "node": None, "op": None}
    if isinstance(e, TriplaneError):
        return error_body(e)
    return {"kind": "internal", "message": "internal error (see the scheduler log)", "node": None, "op": None}


async def abort(context: grpc.aio.ServicerContext, e: BaseException) -> NoReturn:
    """End the call with ``e``'s code, message and error body (raises ``AbortError``)."""
    body = error_of(e)
    if isinstance(e, MetaDBError):
        log.warning("metadb error serving a gRPC call: %s", e)
    elif not isinstance(e, TriplaneError):
        log.error("unhandled error serving a gRPC call", exc_info=e)
    elif body["kind"] not in CODE:
        log.error("domain error of unmapped kind %r: %s", body["kind"], e)
    code = code_of(body["kind"])
    await context.abort(code, body["message"], trailing_metadata=((ERROR_KEY, json.dumps(body)),))


Req = TypeVar("Req")
Rep = TypeVar("Rep")


def unary(fn: Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Rep]]) -> Any:
    """A unary-reply handler whose errors end the call with their gRPC code (:func:`abort`);
    a cancelled call or one already aborted goes on as it is."""

    @functools.wraps(fn)
    async def handler(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Rep:
        try:
            return await fn(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as e:
            await abort(context, e)

    return handler
