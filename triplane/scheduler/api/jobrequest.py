"""The front door of a job: ``parse_job_request`` checks a ``POST /v1/jobs`` body (and a
gRPC SubmitJob's, which carries the same JSON) before anything else reads it.

Strict JSON (a duplicate key anywhere is a 400), the known fields, the ids and declared
ranks of ``check_submission`` (400 naming the node or field), ``deadline_s`` (the job
fails with kind "deadline" if not ended by then), ``wait_s``/``inline`` and ``release`` (``waiting.py``),
``grad`` ((of, wrt): ``proto/autograd.py``; the gradients ``grad:<w>`` join the fetch
list), ``persist`` (``"file"`` or ``"redis"``: docs/storage.md) and ``name``/``tags``
(``admin.pop_labels``), ``prefer`` (an executor's name: the tasks the dispatcher places go
there while it is up, ``Jobs.prefer``). A body with ``plan`` instead of ``graph`` is a compiled step: a
:class:`BoundRequest` in place of the :class:`JobRequest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triplane.proto.autograd import GRAD_PREFIX, check_grad_request
from triplane.proto.errors import GraphError, LimitError
from triplane.proto.validate import check_submission, loads_json
from triplane.scheduler.api.admin import pop_labels
from triplane.scheduler.api.bound import BoundRequest, check_prefer, parse_bound_request
from triplane.scheduler.api.waiting import Waiting, check_inline, pop_release, pop_waiting
from triplane.scheduler.errors import BadRequest

__all__ = ["PERSIST_KINDS", "JobRequest", "parse_job_request"]

PERSIST_KINDS = ("file", "redis")
_FIELDS = ("deadline_s", "fetch", "grad", "graph", "persist", "prefer")  # besides name, tags, wait_s, inline


@dataclass(frozen=True)
class JobRequest:
    """A checked graph job request: the graph document (not parsed further yet), what to
    fetch, and the job's options."""

    graph: Any
    fetch: list[str]
    deadline_s: float | None = None
    grad: tuple[str, list[str]] | None = None
    persist: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()
    prefer: str | None = None


def parse_job_request(body: bytes | bytearray
                      ) -> tuple[JobRequest | BoundRequest, Waiting | None, tuple[str, ...]]:
    """(the request, how to wait for it, the jobs to release after it) of a job body;
    BadRequest naming what is wrong."""
    try:
        doc = loads_json(body)
    except GraphError as e:  # a duplicate key, NaN or Infinity
        raise BadRequest(f"the body is not strict JSON: {e}") from None
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not JSON: {e}") from None
    waiting = pop_waiting(doc) if isinstance(doc, dict) else None
    release = pop_release(doc) if isinstance(doc, dict) else ()
    if isinstance(doc, dict) and "plan" in doc and "graph" not in doc:
        bound = parse_bound_request(doc)
        check_inline(waiting, bound.fetch)
        return bound, waiting, release
    if not isinstance(doc, dict) or "graph" not in doc:
        raise BadRequest('expected {"graph": <graph document>, "fetch": [node ids]}')
    name, tags = pop_labels(doc)
    unknown = set(doc) - set(_FIELDS)
    if unknown:
        known = sorted([*_FIELDS, "inline", "name", "release", "tags", "wait_s"])
        raise BadRequest(f"unknown field(s) {sorted(unknown)} (known: {known})")
    persist = doc.get("persist")
    if persist is not None and persist not in PERSIST_KINDS:
        raise BadRequest(f"'persist' must be one of {list(PERSIST_KINDS)}, got {persist!r:.40}")
    deadline_s = doc.get("deadline_s")
    if deadline_s is not None and (type(deadline_s) not in (int, float) or not 0 < deadline_s <= 604800):
        raise BadRequest(f"'deadline_s' must be seconds in (0, 604800], got {deadline_s!r:.40}")
    graph = doc["graph"]
    fetch = doc.get("fetch")
    if fetch is None and isinstance(graph, dict):
        fetch = list(graph.get("outputs") or [])
    try:
        grad = check_grad_request(doc["grad"]) if "grad" in doc else None
        if grad is not None and isinstance(fetch, list):  # the gradients asked for are fetched
            fetch = fetch + [n for n in (GRAD_PREFIX + w for w in grad[1]) if n not in fetch]
        check_submission(graph, fetch)
    except GraphError as e:
        kind = "limit" if isinstance(e, LimitError) else "graph"
        raise BadRequest(str(e), kind=kind, node=e.node, op=e.op) from None
    check_inline(waiting, fetch)
    prefer = check_prefer(doc.get("prefer"))
    return JobRequest(graph, fetch, deadline_s, grad, persist, name, tags, prefer), waiting, release
