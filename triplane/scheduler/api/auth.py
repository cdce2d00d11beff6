"""Bearer-token auth for the REST API.

Every route but ``/v1/health`` needs ``Authorization: Bearer <token>``. The comparison is
constant-time (``hmac.compare_digest`` on bytes), so response timing says nothing about
how much of a guess was right. Missing or wrong -> 401 with the error body of
docs/runtime.md and ``WWW-Authenticate: Bearer``.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from triplane.scheduler.api.errors import ApiError


def check_bearer(header: str | None, token: bytes) -> None:
    """Raise a 401 ``ApiError`` unless ``header`` is ``Bearer <token>``."""
    if not header:
        raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token):
        raise ApiError(401, "unauthorized", "wrong bearer token")


def require_token(token: bytes):
    """A dependency checking the request's bearer token against ``token``."""

    async def dependency(request: Request) -> None:
        check_bearer(request.headers.get("authorization"), token)

    return dependency
