"""Who is calling, and may they: bearer tokens with roles, and the node credential.

Every route but ``/v1/health`` needs ``Authorization: Bearer <token>``. A token is one of

* the **admin token** the scheduler was started with (``--token-file``; the run
  directory's ``token`` file under ``triplane up``), principal name ``admin``;
* a **client token** listed in ``tokens.json`` (``tokens.py``): role ``admin``,
  ``submit`` or ``read``, and a name that owns the jobs it submits;
* the **node credential** (``triplane.registry.credential``), which executors and
  scheduler replicas derive from the cluster secret. It opens the served registry and
  nothing else; client tokens never open the registry.

What each role may do (docs/security.md):

=========  ===========================================================================
admin      everything on the REST API (and it alone drains nodes and manages tokens)
submit     upload, submit; see, wait on, fetch, explain, cancel and retry its own jobs
           only (``GET /v1/jobs`` lists only them); see nodes, engines and stats
read       see everything (jobs of everyone, nodes, engines, stats); change nothing
=========  ===========================================================================

:data:`ROUTE_ROLES` is the one table of who may call which route (method and path
template): a route's :meth:`Authenticator.route` dependency reads it, so a route missing
from it answers 500, and a test walks the app's routes and fails on any such route.

Missing or unknown token -> 401 (``WWW-Authenticate: Bearer``); a known one whose role
may not do this -> 403 ``kind: "forbidden"``. Comparisons are constant-time
(``hmac.compare_digest`` on bytes, hashes for the listed tokens), so response timing says
nothing about how much of a guess was right.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from triplane.scheduler.api.tokens import ROLES, TokenBook
from triplane.scheduler.errors import Forbidden, Unauthorized

__all__ = ["ADMIN", "ANYONE", "CHANGERS", "NODE", "PUBLIC", "ROUTE_ROLES", "Authenticator", "Principal",
           "check_bearer"]

NODE = "node"
ADMIN = ("admin",)
CHANGERS = ("admin", "submit")  # may upload, submit and cancel
ANYONE = ROLES  # every client role (never the node credential)
PUBLIC: tuple[str, ...] = ()  # no credential needed
NODE_ONLY = (NODE,)
_REGISTRY = ("put", "get", "get_prefix", "delete", "delete_prefix", "create", "compare_and_swap",
             "compare_and_delete", "lease/grant", "lease/refresh", "lease/ttl", "lease/revoke", "watch")

# (method, path template) -> the roles that may call it (docs/api.md, "Roles").
ROUTE_ROLES: dict[tuple[str, str], tuple[str, ...]] = {
    ("GET", "/health"): PUBLIC,
    ("GET", "/"): PUBLIC,  # the dashboard's files (api/static.py): no data, no secret
    ("GET", "/dashboard/{name}"): PUBLIC,
    ("GET", "/ready"): PUBLIC,
    ("GET", "/v1/health"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/v1/whoami"): ANYONE,
    ("POST", "/v1/tensors"): CHANGERS,
    ("POST", "/v1/tensors/copy"): CHANGERS,
    ("DELETE", "/v1/tensors/{upload}"): CHANGERS,
    ("POST", "/v1/sessions"): CHANGERS,
    ("POST", "/v1/sessions/{sid}/renew"): CHANGERS,
    ("DELETE", "/v1/sessions/{sid}"): CHANGERS,
    ("POST", "/v1/jobs"): CHANGERS,
    ("GET", "/v1/jobs"): ANYONE,
    ("GET", "/v1/jobs/{job}"): ANYONE,
    ("GET", "/v1/jobs/{job}/wait"): ANYONE,
    ("GET", "/v1/jobs/{job}/tensors/{name}"): ANYONE,
    ("GET", "/v1/jobs/{job}/plan"): ANYONE,
    ("GET", "/v1/jobs/{job}/tasks"): ANYONE,
    ("GET", "/v1/jobs/{job}/tiles"): ANYONE,
    ("GET", "/v1/jobs/{job}/timeline"): ANYONE,
    ("GET", "/v1/jobs/{job}/graph"): ANYONE,
    ("GET", "/v1/storage"): ANYONE,
    ("DELETE", "/v1/jobs/{job}"): CHANGERS,
    ("POST", "/v1/jobs/{job}/cancel"): CHANGERS,
    ("POST", "/v1/jobs/{job}/retry"): CHANGERS,
    ("GET", "/v1/nodes"): ANYONE,
    ("GET", "/v1/nodes/{node}"): ANYONE,
    ("POST", "/v1/nodes/{node}/drain"): ADMIN,
    ("POST", "/v1/nodes/{node}/undrain"): ADMIN,
    ("GET", "/v1/engines"): ANYONE,
    ("GET", "/v1/stats"): ANYONE,
    ("GET", "/v1/config"): ANYONE,
    ("GET", "/v1/tokens"): ADMIN,
    ("POST", "/v1/tokens"): ADMIN,
    ("DELETE", "/v1/tokens/{name}"): ADMIN,
    # the event stream and metrics (api/events.py)
    ("GET", "/v1/events"): ANYONE,
    ("GET", "/metrics"): ANYONE,
    # the served registry (triplane.registry.http_server checks the node credential itself)
    **{("POST", f"/v1/registry/{op}"): NODE_ONLY for op in _REGISTRY},
}


@dataclass(frozen=True)
class Principal:
    """Who a request is from: ``name`` (the owner of the jobs it submits) and ``role``
    (``admin``, ``submit``, ``read``, or ``node`` for the node credential)."""

    name: str
    role: str

    @property
    def sees_all_jobs(self) -> bool:
        return self.role in ("admin", "read")


def _bearer(header: str | None) -> str:
    if not header:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("wrong bearer token")
    return given


def check_bearer(header: str | None, token: bytes) -> None:
    """Raise ``Unauthorized`` unless ``header`` is ``Bearer <token>``."""
    if not hmac.compare_digest(_bearer(header).encode("utf-8", "surrogateescape"), token):
        raise Unauthorized("wrong bearer token")


class Authenticator:
    """Maps a request's bearer token to a :class:`Principal` (401 if none matches)."""

    def __init__(self, admin_token: str | bytes | None, *, tokens_file: Path | None = None,
                 node_credential: str | None = None) -> None:
        admin = admin_token.encode() if isinstance(admin_token, str) else admin_token
        self._admin = admin or None
        self._node = node_credential.encode() if node_credential else None
        self.book = TokenBook(tokens_file)

    def identify(self, header: str | None) -> Principal:
        given = _bearer(header)
        raw = given.encode("utf-8", "surrogateescape")
        # Every comparison runs whatever matches, so timing does not say which one did.
        is_admin = self._admin is not None and hmac.compare_digest(raw, self._admin)
        is_node = self._node is not None and hmac.compare_digest(raw, self._node)
        entry = self.book.lookup(given)
        if is_admin:
            return Principal("admin", "admin")
        if is_node:
            return Principal(NODE, NODE)
        if entry is not None:
            return Principal(entry.name, entry.role)
        raise Unauthorized("wrong bearer token")

    def is_client_token(self, given: str) -> bool:
        """Whether ``given`` is a client token (any role): the served registry answers
        those 403 rather than 401."""
        raw = given.encode("utf-8", "surrogateescape")
        is_admin = self._admin is not None and hmac.compare_digest(raw, self._admin)
        return self.book.lookup(given) is not None or is_admin

    async def route(self, request: Request) -> Principal:
        """A FastAPI dependency: the caller's principal if :data:`ROUTE_ROLES` lets its role
        call the matched route, else 401 (no or unknown token) or 403 naming the route."""
        route = request.scope.get("route")
        key = (request.method, getattr(route, "path", ""))
        if key not in ROUTE_ROLES:  # a route added without an entry: a bug (tests catch it)
            raise RuntimeError(f"route {key} is missing from auth.ROUTE_ROLES")
        allowed = ROUTE_ROLES[key]
        p = self.identify(request.headers.get("authorization"))
        if p.role not in allowed:
            who = "the node credential" if p.role == NODE else f"a {p.role} token ({p.name!r})"
            raise Forbidden(f"{who} may not call {key[0]} {key[1]} (roles that may: {sorted(allowed)})")
        return p

    def require(self, roles: Iterable[str], what: str) -> Callable[[Request], Awaitable[Principal]]:
        """A FastAPI dependency: the caller's principal if its role is in ``roles``, else
        401 (unknown) or 403 naming ``what`` it may not do."""
        allowed = frozenset(roles)

        async def dependency(request: Request) -> Principal:
            p = self.identify(request.headers.get("authorization"))
            if p.role not in allowed:
                who = "the node credential" if p.role == NODE else f"a {p.role} token ({p.name!r})"
                raise Forbidden(f"{who} may not {what} "
                                                 f"(roles that may: {sorted(allowed)})")
            return p

        return dependency
