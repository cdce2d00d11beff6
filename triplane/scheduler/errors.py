"""The scheduler's domain errors: what a job, tensor or cluster call refuses, and why.

They extend the ``TriplaneError`` tree (``triplane/proto/errors.py``)::

    TriplaneError
    ├── GraphError (and its subclasses)   the graph or the fetch list is wrong ("graph", "shape", ...)
    └── SchedulerError                    a call the scheduler refuses
        ├── BadRequest        "request"      the request is malformed (not the graph)
        ├── NotFound          "not_found"    unknown job, tensor not fetched, tiles released or gone
        ├── NotReady          "not_ready"    the job has not finished (results are read when done)
        ├── Conflict          "conflict"     the call contradicts the job's state
        ├── TooLarge          "too_large"    over a size bound (a body, a plan to place on demand)
        ├── Unauthorized      "unauthorized" no or a wrong credential
        ├── Forbidden         "forbidden"    the credential may not do this
        ├── Lost              "lost"         a ref's value died with the executor holding it
        ├── Unavailable       "unavailable"  no executor, the metadb or an executor is unreachable
        └── Standby           "standby"      this replica is not the leader (``leader_id`` names it)

Each carries ``kind`` (machine-readable), ``message``, and the ``node`` and ``op`` of the
submitted graph it is about, if any; an error about a ref (``refs.py``) also its ``ref``.
Nothing here knows a transport: the REST API maps ``kind`` to a status code in one
table (``triplane/scheduler/api/errors.py``), the gRPC service to its codes in another
(``triplane/scheduler/grpc/status.py``).
"""

from __future__ import annotations

from typing import Any

from triplane.proto.errors import GraphError, TriplaneError

__all__ = [
    "BadRequest", "Conflict", "Forbidden", "Lost", "NotFound", "NotReady", "SchedulerError", "Standby",
    "TooLarge", "Unauthorized", "Unavailable", "error_body",
]


class SchedulerError(TriplaneError):
    """A call the scheduler refuses. ``kind`` is the class's unless given."""

    kind = "internal"

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None,
                 kind: str | None = None, ref: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.node = node
        self.op = op
        self.ref = ref
        if kind is not None:
            self.kind = kind


class BadRequest(SchedulerError):
    kind = "request"


class NotFound(SchedulerError):
    kind = "not_found"


class NotReady(SchedulerError):
    kind = "not_ready"


class Conflict(SchedulerError):
    kind = "conflict"


class TooLarge(SchedulerError):
    kind = "too_large"


class Unauthorized(SchedulerError):
    kind = "unauthorized"


class Forbidden(SchedulerError):
    kind = "forbidden"


class Lost(SchedulerError):
    """The executor holding a ref's value is gone (``ref`` names it): the value is lost."""

    kind = "lost"


class Unavailable(SchedulerError):
    kind = "unavailable"


class Standby(SchedulerError):
    """This scheduler is a standby; ``leader_id`` is the leader's id (None: none elected)."""

    kind = "standby"

    def __init__(self, leader_id: str | None) -> None:
        who = f"the leader is {leader_id}" if leader_id else "no leader is elected yet"
        super().__init__(f"this scheduler is a standby; {who}")
        self.leader_id = leader_id


def error_body(e: TriplaneError) -> dict[str, Any]:
    """The ``{"kind", "message", "node", "op"}`` body of a domain error (a GraphError's
    message names its node and op already), with ``ref`` for an error about a ref."""
    if isinstance(e, SchedulerError):
        body = {"kind": e.kind, "message": e.message, "node": e.node, "op": e.op}
        if e.ref is not None:
            body["ref"] = e.ref
        return body
    if isinstance(e, GraphError):
        return {"kind": e.kind, "message": str(e), "node": e.node, "op": e.op}
    return {"kind": e.kind, "message": str(e), "node": getattr(e, "node", None), "op": getattr(e, "op", None)}
