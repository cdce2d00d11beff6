"""The API's one error shape: ``{"error": {"kind", "message", "node", "op"}}``.

Statuses (docs/runtime.md): 400 malformed graph or request (naming the node and op),
401 missing or wrong token, 404 unknown job or tensor, 409 result not ready, 413 over a
size limit, 503 a standby scheduler or no executors. FastAPI's own validation errors and
unexpected exceptions are mapped to the same shape (500 says nothing internal).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from triplane.metadb import MetaDBError
from triplane.scheduler.service import SubmitError

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        node: str | None = None,
        op: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"kind": kind, "message": message, "node": node, "op": op}
        self.headers = headers


def error_response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    """Map every error the app can raise to the error shape."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, e: ApiError) -> JSONResponse:
        headers = dict(e.headers or {})
        if e.status == 401:
            headers.setdefault("WWW-Authenticate", "Bearer")
        return error_response(e.status, e.body, headers)

    @app.exception_handler(SubmitError)
    async def _submit(_: Request, e: SubmitError) -> JSONResponse:
        return error_response(e.status, e.body)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error_response(
            400,
            {
                "kind": "request",
                "message": f"{where}: {first.get('msg', 'invalid')}",
                "node": None,
                "op": None,
            },
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "request")
        return error_response(
            e.status_code, {"kind": kind, "message": str(e.detail), "node": None, "op": None}
        )

    @app.exception_handler(MetaDBError)
    async def _db(_: Request, e: MetaDBError) -> JSONResponse:
        log.warning("metadb error serving a request: %s", e)
        return error_response(
            503, {"kind": "unavailable", "message": f"metadata DB: {e}", "node": None, "op": None}
        )

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error serving a request")
        return error_response(
            500,
            {
                "kind": "internal",
                "message": "internal error (see the scheduler log)",
                "node": None,
                "op": None,
            },
        )
