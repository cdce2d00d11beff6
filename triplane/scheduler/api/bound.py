"""The compiled-step request: ``POST /v1/jobs`` with ``{"plan": <hash>, "args": [...],
"fetch": [...]}`` instead of a graph (docs/runtime.md, "Compiled steps"); ``prefer``
names the executor its tasks should run on, as on a graph submit (``jobrequest.py``).

``plan`` is the hash a full submit of the same structure answered with; ``args`` binds
``arg0, arg1, ...`` in order, each an uploaded tensor id (``"u-..."``), a ref to a fetched
output of a done job (``"<job>:<name>"``, ``scheduler/refs.py``) or a small tensor inline,
``{"shape": [...], "dtype": "float32", "data": <base64 of its raw little-endian C-order
bytes>}`` of at most :data:`INLINE_MAX_BYTES`; ``fetch`` is the list the full
submit gave. ``await_refs_s`` (a pipelined step, docs/runtime.md): a ref to a job still
running waits up to that long for its end instead of 409 ``not_ready``; ``inline_refs``
(at most :data:`MAX_INLINE_REFS` refs, usually the step before's outputs that it did not
keep: its loss) come back in the answer's ``ref_values`` as ``values`` do (at most
``INLINE_MAX_BYTES`` each, once their job is done; one left out is fetched). Checked here at
the front door (400 naming the field); the scheduler answers 409 ``unknown_plan`` for a
structure it does not know, and the client sends the graph.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, NamedTuple

from triplane.proto.limits import MAX_RANK
from triplane.scheduler.errors import BadRequest
from triplane.scheduler.refs import parse_ref
from triplane.scheduler.store import UploadError, expected_bytes, parse_dtype

INLINE_MAX_BYTES = 64 * 1024
MAX_ARGS = 10_000
MAX_AWAIT_REFS_S = 60.0  # the longest a step waits for the job whose outputs it binds
MAX_INLINE_REFS = 64

# one argument: an upload id, or (raw bytes, shape, dtype) to store
Arg = str | tuple[bytes, tuple[int, ...], str]


class BoundRequest(NamedTuple):
    plan: str
    args: list[Arg]
    fetch: list[str]
    deadline_s: float | None
    prefer: str | None = None
    await_refs_s: float = 0.0
    inline_refs: tuple[str, ...] = ()


def parse_bound_request(doc: dict[str, Any]) -> BoundRequest:
    """The fields of a parsed compiled-step request; BadRequest naming a bad one."""
    known = {"plan", "args", "fetch", "deadline_s", "prefer", "await_refs_s", "inline_refs"}
    unknown = set(doc) - known
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)} (known: {sorted(known)})")
    plan = doc.get("plan")
    if not isinstance(plan, str) or not 1 <= len(plan) <= 128 or not plan.isalnum():
        raise BadRequest("'plan' must be the hash a submit of the graph answered with")
    fetch, args = doc.get("fetch"), doc.get("args")
    if not isinstance(fetch, list) or len(fetch) > 10_000 or not all(type(f) is str for f in fetch):
        raise BadRequest("'fetch' must be a list of at most 10000 node ids")
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        raise BadRequest(f"'args' must be a list of at most {MAX_ARGS} uploads or inline tensors")
    deadline_s = doc.get("deadline_s")
    if deadline_s is not None and (type(deadline_s) not in (int, float) or not 0 < deadline_s <= 604800):
        raise BadRequest(f"'deadline_s' must be seconds in (0, 604800], got {deadline_s!r:.40}")
    await_s = doc.get("await_refs_s", 0.0)
    if type(await_s) not in (int, float) or not 0 <= await_s <= MAX_AWAIT_REFS_S:
        raise BadRequest(f"'await_refs_s' must be seconds in [0, {MAX_AWAIT_REFS_S:g}], got {await_s!r:.40}")
    inline_refs = doc.get("inline_refs", [])
    if (not isinstance(inline_refs, list) or len(inline_refs) > MAX_INLINE_REFS
            or not all(parse_ref(r) is not None for r in inline_refs)):
        raise BadRequest(f"'inline_refs' must be a list of at most {MAX_INLINE_REFS} refs "
                         "(<job>:<fetched name>)")
    return BoundRequest(plan, [_arg(i, a) for i, a in enumerate(args)], fetch, deadline_s,
                        check_prefer(doc.get("prefer")), float(await_s), tuple(dict.fromkeys(inline_refs)))


def check_prefer(prefer: Any) -> str | None:
    """A job's ``prefer``: the name of the executor its tasks should run on (``Jobs.prefer``),
    or None; BadRequest unless a node name (a registry key segment) of at most 128 characters."""
    if prefer is None:
        return None
    if not isinstance(prefer, str) or not 1 <= len(prefer) <= 128 or "/" in prefer or "\x00" in prefer \
            or prefer in (".", ".."):
        raise BadRequest(f"'prefer' must be an executor's name (GET /v1/nodes), got {prefer!r:.40}")
    return prefer


def _arg(i: int, a: Any) -> Arg:
    if isinstance(a, str):
        if (not a.startswith("u-") or len(a) > 64) and parse_ref(a) is None:
            raise BadRequest(f"args[{i}]: {a[:40]!r} is not an uploaded tensor id or a ref (<job>:<name>)")
        return a
    if not isinstance(a, dict) or set(a) != {"shape", "dtype", "data"}:
        raise BadRequest(f"args[{i}]: an upload id or {{'shape', 'dtype', 'data'}}")
    shape = a["shape"]
    if not isinstance(shape, list) or len(shape) > MAX_RANK or \
            not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(f"args[{i}]: 'shape' must be a list of at most {MAX_RANK} sizes >= 0")
    try:
        dtype = parse_dtype(a["dtype"]) if isinstance(a["dtype"], str) else ""
        if not dtype:
            raise UploadError("'dtype' must be a dtype name")
        need = expected_bytes(tuple(shape), dtype)
        if need > INLINE_MAX_BYTES:
            raise UploadError(f"{need} bytes inline, over {INLINE_MAX_BYTES}: upload it")
        if not isinstance(a["data"], str) or len(a["data"]) > 4 * (INLINE_MAX_BYTES // 3 + 1):
            raise UploadError("'data' must be base64 text of at most the inline limit")
        data = base64.b64decode(a["data"], validate=True)
    except (UploadError, binascii.Error, ValueError) as e:
        raise BadRequest(f"args[{i}]: {e}") from None
    if len(data) != need:
        raise BadRequest(f"args[{i}]: {dtype}{shape} is {need} bytes, 'data' has {len(data)}")
    return data, tuple(shape), dtype
