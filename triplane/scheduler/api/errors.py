"""The API's one error shape, ``{"error": {"kind", "message", "node", "op"}}``, and the one
table from an error's ``kind`` to its HTTP status.

The core raises domain errors (``triplane/scheduler/errors.py``, ``GraphError``): they know
no status code; :data:`STATUS` says which code each kind answers (docs/runtime.md). A kind
missing from the table is a bug: it answers 500. What only HTTP knows (a body over its
bound, a bad header, a missing bearer token) is refused with the same domain errors
(``BadRequest``, ``TooLarge``, ``Unauthorized``, ``Forbidden``). FastAPI's own validation
errors and unexpected exceptions are mapped to the same shape (500 says nothing internal).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from triplane.metadb import MetaDBError
from triplane.proto.errors import TriplaneError
from triplane.scheduler.errors import error_body

log = logging.getLogger(__name__)

# kind -> HTTP status: the only place a status code is chosen for a domain error.
STATUS: dict[str, int] = {
    # the graph or the request is wrong (the body names the node and op)
    "request": 400, "graph": 400, "shape": 400, "dtype": 400, "attr": 400, "limit": 400,
    "unknown_op": 400, "placement": 400, "not_differentiable": 400,
    # a model file refused (triplane/proto/errors.py ModelFileError: its kind says which check)
    "model_file": 400, "not_a_model": 400, "truncated": 400, "corrupted": 400,
    "unsupported_version": 400, "unsigned": 400, "bad_signature": 400, "tampered": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "not_ready": 409, "conflict": 409, "unknown_plan": 409,
    "lost": 410,
    "too_large": 413,
    "internal": 500,
    "unavailable": 503, "standby": 503,
}


def status_of(kind: str) -> int:
    """The HTTP status of an error ``kind`` (500 for a kind the table does not know)."""
    return STATUS.get(kind, 500)


def error_response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    """Map every error the app can raise to the error shape."""

    @app.exception_handler(TriplaneError)
    async def _domain(_: Request, e: TriplaneError) -> JSONResponse:
        status = status_of(e.kind)
        if status == 500:
            log.error("domain error of unmapped kind %r: %s", e.kind, e)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return error_response(status, error_body(e), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _plain("request", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "request")
        return error_response(
            e.status_code, {"kind": kind, "message": str(e.detail), "node": None, "op": None}
        )

    @app.exception_handler(MetaDBError)
    async def _db(_: Request, e: MetaDBError) -> JSONResponse:
        log.warning("metadb error serving a request: %s", e)
        return _plain("unavailable", f"metadata DB: {e}")

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error serving a request")
        return _plain("internal", "internal error (see the scheduler log)")


def _plain(kind: str, message: str) -> JSONResponse:
    return error_response(status_of(kind), {"kind": kind, "message": message, "node": None, "op": None})
