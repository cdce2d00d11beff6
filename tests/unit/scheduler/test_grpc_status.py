"""The gRPC front door's error table (triplane/scheduler/grpc/status.py) against REST's."""

from __future__ import annotations

from pathlib import Path

import grpc

from triplane.metadb import MetaDBError
from triplane.proto.dataport import DataPortError
from triplane.proto.errors import ShapeError
from triplane.scheduler.api.errors import STATUS
from triplane.scheduler.errors import Forbidden, NotFound, Standby, TooLarge
from triplane.scheduler.grpc.status import CODE, code_of, error_of

C = grpc.StatusCode


def test_every_kind_of_the_rest_table_has_a_grpc_code() -> None:
    """One set of kinds: a kind added to REST's table without a gRPC code fails here."""
    assert set(CODE) == set(STATUS)


def test_codes_agree_with_the_http_statuses() -> None:
    """The same class of answer on both transports (400 <-> INVALID_ARGUMENT, ...)."""
    same = {400: C.INVALID_ARGUMENT, 401: C.UNAUTHENTICATED, 403: C.PERMISSION_DENIED, 404: C.NOT_FOUND,
            405: C.UNIMPLEMENTED, 409: C.FAILED_PRECONDITION, 410: C.DATA_LOSS,
            413: C.RESOURCE_EXHAUSTED, 500: C.INTERNAL, 503: C.UNAVAILABLE}
    for kind, status in STATUS.items():
        assert CODE[kind] == same[status], kind


def test_an_unknown_kind_is_internal() -> None:
    assert code_of("no-such-kind") == C.INTERNAL


def test_error_bodies() -> None:
    assert error_of(NotFound("unknown job 'j1'")) == {"kind": "not_found", "message": "unknown job 'j1'",
                                                      "node": None, "op": None}
    assert code_of(error_of(Standby("s2"))["kind"]) == C.UNAVAILABLE
    assert code_of(error_of(TooLarge("big"))["kind"]) == C.RESOURCE_EXHAUSTED
    assert code_of(error_of(Forbidden("no"))["kind"]) == C.PERMISSION_DENIED
    shape = error_of(ShapeError("matmul of [2, 3] and [4, 5]", node="y", op="matmul"))
    assert (shape["kind"], shape["node"], shape["op"]) == ("shape", "y", "matmul")
    assert error_of(MetaDBError("down"))["kind"] == "unavailable"
    assert error_of(DataPortError("gone", kind="missing"))["kind"] == "unavailable"
    secret = error_of(KeyError("a private detail"))
    assert secret["kind"] == "internal" and "private" not in secret["message"]


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table under ``heading`` in docs/grpc.md (cells stripped)."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "grpc.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln.strip().strip("|").split("|") for ln in section.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in r] for r in rows[2:]]  # past the header and its rule


def test_the_docs_error_table_is_the_code_table() -> None:
    documented = {kind.strip(): (code, int(status)) for kinds, code, status in _table("Errors")
                  for kind in kinds.split(",")}
    assert {k: c for k, (c, _) in documented.items()} == {k: c.name for k, c in CODE.items()}
    assert {k: s for k, (_, s) in documented.items()} == STATUS


def test_the_docs_role_table_is_the_service_table() -> None:
    from triplane.scheduler.grpc.service import ROLES

    roles = ("admin", "submit", "read")
    documented = {row[0]: {r for r, cell in zip(roles, row[1:]) if cell != "no"}
                  for row in _table("Tokens and roles")}
    assert documented == {m: set(allowed) for m, (allowed, _) in ROLES.items()}
