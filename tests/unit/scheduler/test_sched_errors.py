"""Domain errors carry a machine-readable kind and no status; the API maps kinds to
statuses in one table, keeping the statuses the API always answered."""

from __future__ import annotations

import pytest

from triplane.proto import errors as proto_errors
from triplane.proto.errors import GraphError, TriplaneError
from triplane.scheduler import errors
from triplane.scheduler.api.errors import STATUS, status_of
from triplane.scheduler.compiler.placement import PlacementError


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


@pytest.mark.parametrize("kind,status", [
    ("request", 400), ("graph", 400), ("shape", 400), ("dtype", 400), ("attr", 400), ("limit", 400),
    ("unknown_op", 400), ("placement", 400), ("unauthorized", 401), ("forbidden", 403),
    ("not_found", 404), ("not_ready", 409), ("conflict", 409), ("lost", 410), ("too_large", 413),
    ("unavailable", 503), ("standby", 503), ("internal", 500),
])
def test_each_kind_keeps_the_status_the_api_answered(kind: str, status: int) -> None:
    assert status_of(kind) == status


def test_every_domain_error_has_a_kind_the_table_maps() -> None:
    # what the scheduler's core can raise to the API: the tree's and the scheduler's own
    domain = [c for c in _subclasses(TriplaneError)
              if c.__module__ == "triplane.proto.errors" or c.__module__.startswith("triplane.scheduler.")]
    assert errors.NotFound in domain and PlacementError in domain and proto_errors.ShapeError in domain
    for cls in domain:
        if cls is proto_errors.KernelError:  # a task's error: in a job's status, never raised to a client
            continue
        assert cls.kind in STATUS, cls
        assert cls.kind != "internal" or cls in (errors.SchedulerError,), cls


def test_domain_errors_know_no_status_code() -> None:
    e = errors.NotFound("unknown job 'j1'", node="y")
    assert not hasattr(e, "status") and not hasattr(e, "status_code")
    body = {"kind": "not_found", "message": "unknown job 'j1'", "node": "y", "op": None}
    assert errors.error_body(e) == body
    s = errors.Standby("10.0.0.7:8470")
    assert s.kind == "standby" and "10.0.0.7:8470" in s.message and s.leader_id == "10.0.0.7:8470"
    g = proto_errors.ShapeError("inner dimensions differ", node="y", op="matmul")
    assert errors.error_body(g) == {"kind": "shape", "message": str(g), "node": "y", "op": "matmul"}
    assert isinstance(g, GraphError) and g.kind == "shape" and GraphError("x").kind == "graph"
