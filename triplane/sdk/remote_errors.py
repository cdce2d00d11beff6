"""How the scheduler's errors come back to the SDK (docs/runtime.md's error table).

400 with a graph kind -> :class:`GraphError` (the subclass the kind names), a failed job ->
:class:`KernelError` naming the op and node, 401 -> :class:`RemoteError` saying the token
was refused; anything else -> :class:`RemoteError` with the server's message and status.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from triplane.proto import errors as E

if TYPE_CHECKING:
    import httpx

__all__ = ["RemoteError", "Unreachable", "http_error", "job_error", "lost_holder", "request",
           "with_retries"]

# Error kinds a scheduler reports for a malformed graph, and the exception each becomes.
_GRAPH_KINDS: dict[str, type[E.GraphError]] = {
    "graph": E.GraphError, "validation": E.GraphError, "shape": E.ShapeError, "dtype": E.DTypeError,
    "attr": E.AttrError, "limit": E.LimitError, "unknown_op": E.UnknownOpError,
    "placement": E.GraphError,  # no node can run a task (the scheduler's placement refused it)
}


class RemoteError(E.TriplaneError):
    """The cluster could not be reached, refused the request, or lost the job.

    ``kind`` is the scheduler's error kind when it gave one (``"lost"``: an executor
    holding an input of the job is gone; ``ref`` then names that input)."""

    def __init__(self, message: str, *, status: int | None = None, kind: str | None = None,
                 ref: str | None = None) -> None:
        self.status = status
        self.kind = kind
        self.ref = ref
        super().__init__(message)


def _error_body(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {"message": r.text[:500]}
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return err
    if isinstance(err, str):
        return {"message": err}
    if isinstance(body, dict) and "detail" in body:  # FastAPI's own errors
        return {"message": str(body["detail"])}
    return {"message": str(body)[:500]}


def _strip_prefix(message: str, node: str | None, op: str | None) -> str:
    """The message without the ``node 'x' (op): `` prefix our exceptions add again."""
    for prefix in (f"node {node!r} ({op}): ", f"node {node!r}: ", f"{op}: "):
        if (node or op) and message.startswith(prefix):
            return message[len(prefix):]
    return message


def _mapped(err: dict[str, Any], default_kind: str) -> E.TriplaneError | None:
    kind = str(err.get("kind") or default_kind)
    node, op = err.get("node"), err.get("op")
    node = str(node) if node is not None else None
    op = str(op) if op is not None else None
    message = _strip_prefix(str(err.get("message") or "(no message)"), node, op)
    if kind in _GRAPH_KINDS:
        return _GRAPH_KINDS[kind](message, node=node, op=op)
    if kind in ("user", "kernel"):
        return E.KernelError(message, node=node, op=op, kind="user")
    if kind == "infra":
        return E.KernelError(message, node=node, op=op, kind="infra")
    if kind == "not_differentiable":
        return E.NotDifferentiableError(message)
    return None


def http_error(r: httpx.Response, what: str, url: str) -> E.TriplaneError:
    err = _error_body(r)
    if r.status_code == 401:
        return RemoteError(f"the scheduler at {url} refused the API token ({what}: "
                           f"{err.get('message')}); use the run directory's `token` file that "
                           f"`triplane up` wrote (or TRIPLANE_TOKEN, or a token from `triplane tokens "
                           f"add`)", status=401)
    if r.status_code == 400:
        mapped = _mapped(err, "graph")
        if mapped is not None:
            return mapped
    return RemoteError(f"{what} -> {r.status_code}: {err.get('message')}", status=r.status_code,
                       kind=_opt_str(err.get("kind")), ref=_opt_str(err.get("ref")))


def job_error(job: str, err: Any) -> E.TriplaneError:
    if isinstance(err, str):
        err = {"message": err}
    if not isinstance(err, dict):
        err = {"message": "the scheduler gave no reason"}
    mapped = _mapped(err, "infra")
    if mapped is None:
        return RemoteError(f"job {job} failed: {err.get('message')}", kind=_opt_str(err.get("kind")),
                           ref=_opt_str(err.get("ref")))
    return mapped


def _opt_str(v: Any) -> str | None:
    return str(v) if v is not None else None


def lost_holder(e: RemoteError) -> bool:
    """Whether a fetch failed because the executor holding the tile is dead or gone (503
    ``cannot read ...`` while it is still registered, 404 ``... which is gone`` after)."""
    msg = str(e)
    return (e.status == 503 and "cannot read" in msg) or (e.status == 404 and "which is gone" in msg)


class Unreachable(Exception):
    """A try that got no answer; ``retriable``: nothing can have arrived (a refused
    connection), or the caller allows sending again."""

    def __init__(self, detail: str, retriable: bool) -> None:
        super().__init__(detail)
        self.retriable = retriable


def with_retries(attempt: Callable[[], Any], url: str, what: str, reconnect_s: float) -> Any:
    """``attempt()`` (a response with ``status_code``, or :class:`Unreachable`), tried again
    with backoff while the scheduler is unreachable (retriable) or answers 503, for up to
    ``reconnect_s``. A :class:`RemoteError` saying so when it stays unreachable, and
    :func:`http_error` of an answer of 400 or more."""
    deadline = time.monotonic() + reconnect_s
    delay = 0.05
    while True:
        try:
            r = attempt()
        except Unreachable as e:
            if not e.retriable or time.monotonic() + delay > deadline:
                raise RemoteError(f"cannot reach the scheduler at {url} ({what}): {e}. "
                                  "Is the cluster up? (`triplane status`)") from None
        else:
            if r.status_code != 503 or time.monotonic() + delay > deadline:
                break
        time.sleep(delay)
        delay = min(1.0, delay * 2)
    if r.status_code >= 400:
        raise http_error(r, what, url)
    return r


def request(client: httpx.Client, url: str, reconnect_s: float, method: str, path: str, *,
            retry_sent: bool, **kw: Any) -> httpx.Response:
    """One request of ``client`` to the scheduler at ``url`` (:func:`with_retries`);
    ``retry_sent=False`` retries only a refused connection."""
    import httpx

    def attempt() -> httpx.Response:
        try:
            return client.request(method, path, **kw)
        except httpx.TransportError as e:
            raise Unreachable(f"{type(e).__name__}: {e}",
                              retry_sent or isinstance(e, httpx.ConnectError)) from None

    r: httpx.Response = with_retries(attempt, url, f"{method} {path}", reconnect_s)
    return r
