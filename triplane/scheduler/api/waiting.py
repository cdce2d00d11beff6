"""One request per step: ``wait_s`` and ``inline`` on both forms of ``POST /v1/jobs``
(docs/runtime.md, "Waiting for a job in its submit").

``"wait_s"`` (a number, 0 < wait_s <= :data:`MAX_WAIT_S`): the answer comes when the job is
terminal or ``wait_s`` has passed, with its state, progress and ``error`` as
``GET /v1/jobs/{id}`` gives them. ``"inline"`` (a list of fetched names; it needs
``wait_s``): a done job's answer holds the values of those of at most
:data:`~triplane.scheduler.api.bound.INLINE_MAX_BYTES` bytes in ``values`` (larger ones are
left out: fetch them as usual). Checked here (400 naming the field); without ``wait_s``
nothing changes.

``"release"`` (a list of at most :data:`MAX_RELEASE` job ids and upload ids, either form,
with or without ``wait_s``): jobs and uploads whose values the client no longer holds,
released as ``DELETE /v1/jobs/{id}`` and ``DELETE /v1/tensors/{id}`` release them once
this job is submitted and its answer sent (so a step releases the step before it, and
the uploads that died meanwhile, without a request of their own). The caller must be
allowed to delete each (else 403 and nothing is submitted); one that is unknown or
already released is skipped, and a release that fails is logged, not answered.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from triplane.scheduler.errors import BadRequest

MAX_WAIT_S = 60.0
MAX_RELEASE = 1000


class Waiting(NamedTuple):
    wait_s: float
    inline: tuple[str, ...]


def pop_waiting(doc: dict[str, Any]) -> Waiting | None:
    """Take ``wait_s`` and ``inline`` out of a job request (so that the rest is checked as
    before); None without ``wait_s``. BadRequest naming a malformed field."""
    wait_s, inline = doc.pop("wait_s", None), doc.pop("inline", None)
    if wait_s is None:
        if inline is not None:
            raise BadRequest("'inline' needs 'wait_s': values come back in the answer of a submit that waits")
        return None
    if type(wait_s) not in (int, float) or not 0 < wait_s <= MAX_WAIT_S:
        raise BadRequest(f"'wait_s' must be seconds in (0, {MAX_WAIT_S:g}], got {wait_s!r:.40}")
    if inline is None:
        inline = []
    if not isinstance(inline, list) or len(inline) > 10_000 or not all(type(n) is str for n in inline):
        raise BadRequest("'inline' must be a list of fetched names")
    return Waiting(float(wait_s), tuple(dict.fromkeys(inline)))


def check_inline(waiting: Waiting | None, fetch: Any) -> None:
    """BadRequest naming an ``inline`` name that ``fetch`` does not list."""
    if waiting is None:
        return
    fetched = set(fetch) if isinstance(fetch, list) else set()
    for i, name in enumerate(waiting.inline):
        if name not in fetched:
            raise BadRequest(f"inline[{i}] = {name[:60]!r} is not in 'fetch'", node=name[:128])


def pop_release(doc: dict[str, Any]) -> tuple[str, ...]:
    """Take ``release`` out of a job request: the job and upload ids to release after it (in
    order, once each); BadRequest naming a malformed one."""
    release = doc.pop("release", None)
    if release is None:
        return ()
    if not isinstance(release, list) or len(release) > MAX_RELEASE:
        raise BadRequest(f"'release' must be a list of at most {MAX_RELEASE} job or upload ids")
    for i, ident in enumerate(release):
        if type(ident) is not str or not 0 < len(ident) <= 128 or not ident.replace("-", "").isalnum():
            raise BadRequest(f"release[{i}] = {str(ident)[:60]!r} is not a job or upload id")
    return tuple(dict.fromkeys(release))
