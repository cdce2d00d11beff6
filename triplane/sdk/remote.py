"""The remote session: ``.numpy()`` runs on a cluster (``tp.connect``).

A :class:`RemoteSession` evaluates tensors the way the embedded session does, but through
the scheduler's REST API (docs/runtime.md, "The REST API"):

1. build the graph and canonicalise it (the same bytes every SDK sends);
2. upload every host tensor it has not uploaded before (``POST /v1/tensors``), remembered
   by array identity with weak references, so a training loop sends each parameter
   value once and nothing is kept alive by the cache;
3. submit (``POST /v1/jobs``), long-poll ``/wait`` until the job ends, and fetch each
   output (``GET /v1/jobs/{id}/tensors/{node}``).

Failure semantics. A request that does not reach the scheduler (connection refused or
reset, e.g. while it restarts) is retried with backoff for up to ``reconnect_s``; a
submit is retried only when the connection was refused, so a job is never submitted
twice. Server errors map back to the SDK's exceptions: 400 with a graph kind ->
:class:`GraphError` (the subclass the kind names), a failed job -> :class:`KernelError`
naming the op and node (and the user's line that made it), 401 -> :class:`RemoteError`
saying the token was refused; anything else -> :class:`RemoteError` with the server's
message. Nothing here parses untrusted data beyond JSON and raw little-endian bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto import errors as E
from triplane.proto.canonjson import canonical_json
from triplane.sdk.remote_steps import BoundSteps

if TYPE_CHECKING:
    import httpx

    from triplane.sdk.tensor import Tensor

__all__ = [
    "LocalCluster", "RemoteError", "RemoteSession", "connect", "resolve_target", "set_local_cluster_lookup",
]

TERMINAL = ("done", "failed", "cancelled")

# Error kinds a scheduler reports for a malformed graph, and the exception each becomes.
_GRAPH_KINDS: dict[str, type[E.GraphError]] = {
    "graph": E.GraphError, "validation": E.GraphError, "shape": E.ShapeError, "dtype": E.DTypeError,
    "attr": E.AttrError, "limit": E.LimitError, "unknown_op": E.UnknownOpError,
    "placement": E.GraphError,  # no node can run a task (the scheduler's placement refused it)
}


class RemoteError(E.TriplaneError):
    """The cluster could not be reached, refused the request, or lost the job."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class _Uploads:
    """Host array -> uploaded tensor id, by identity, without keeping arrays alive.

    Read-only arrays (every SDK tensor value is one) are trusted not to change, so identity
    suffices; a writable array is also keyed by a digest of its bytes, so an in-place edit
    uploads again instead of computing on stale data."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[np.ndarray], str, bytes | None]] = {}

    @staticmethod
    def _digest(arr: np.ndarray) -> bytes | None:
        if not arr.flags.writeable:
            return None
        return hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).digest()

    def get(self, arr: np.ndarray) -> str | None:
        hit = self._by_id.get(id(arr))
        if hit is None or hit[0]() is not arr:
            return None
        return hit[1] if hit[2] == self._digest(arr) else None

    def put(self, arr: np.ndarray, upload_id: str) -> None:
        key = id(arr)

        def forget(_ref: object, key: int = key) -> None:
            self._by_id.pop(key, None)

        try:
            ref = weakref.ref(arr, forget)
        except TypeError:  # not weak-referenceable: do not cache rather than leak
            return
        self._by_id[key] = (ref, upload_id, self._digest(arr))

    def __len__(self) -> int:
        return len(self._by_id)


class RemoteSession:
    """Evaluates graphs on the cluster whose scheduler answers at ``url``.

    ``transport`` is an ``httpx`` transport (tests pass ``httpx.MockTransport`` or an
    ASGI transport); by default a real HTTP connection pool. ``timeout_s`` bounds each
    HTTP request, ``reconnect_s`` how long an unreachable scheduler is retried, and
    ``job_timeout_s`` (None: no bound) how long one job may take before
    :class:`RemoteError`. Thread-safe as far as ``httpx.Client`` is.
    """

    def __init__(self, url: str, token: str | None, transport: httpx.BaseTransport | None = None, *,
                 timeout_s: float = 30.0, reconnect_s: float = 30.0, job_timeout_s: float | None = None,
                 poll_s: float = 10.0) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.reconnect_s = reconnect_s
        self.job_timeout_s = job_timeout_s
        self.poll_s = poll_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                    timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)))
        self._uploads = _Uploads()
        self.steps = BoundSteps()  # compiled steps: structures the scheduler planned before
        self.last_submit: dict[str, Any] = {}
        self.last_job: str | None = None
        self.last_stats: dict[str, Any] = {}

    # --- the session protocol ------------------------------------------------------------

    def evaluate(self, outputs: Sequence[Tensor]) -> list[np.ndarray]:
        """Compute ``outputs`` on the cluster; same values as the embedded session."""
        from triplane.sdk.tensor import build_graph

        t0 = time.perf_counter()
        done, pending = self.steps.run(self, outputs)  # a compiled step: one small request
        if done is not None:
            self.last_stats = {"job": self.last_job, "compiled": True, "seconds": time.perf_counter() - t0}
            return done
        graph, tensors, bindings = build_graph(outputs)
        cgraph, rename, args = graph.canonical()
        doc = json.loads(cgraph.to_json())  # the wire form (constants encoded as the IR says)
        uploaded = 0
        local: dict[str, np.ndarray] = {}  # canonical id -> host value of input nodes
        upload_of: dict[str, str] = {}  # argN -> its upload
        for nid, node in doc["nodes"].items():
            if node["op"] != "input":
                continue
            arr = bindings[args[int(node["attrs"]["tensor"][3:])]]
            upload_id = self._uploads.get(arr)
            if upload_id is None:
                upload_id = self.upload(arr)
                self._uploads.put(arr, upload_id)
                uploaded += 1
            upload_of[node["attrs"]["tensor"]] = upload_id
            node["attrs"]["tensor"] = upload_id
            local[nid] = arr
        # An output that is itself host data needs no trip; the rest is fetched once each.
        fetch = list(dict.fromkeys(o for o in cgraph.outputs if o not in local))
        values: dict[str, np.ndarray] = dict(local)
        if fetch:
            job = self.submit(doc, fetch)
            self.steps.learn(pending, self.last_submit, upload_of, args, rename, outputs, fetch)
            try:
                self.wait(job)
            except E.KernelError as e:
                from triplane.sdk.session import locate_kernel_error

                raise locate_kernel_error(e, rename, tensors) from None
            for nid in fetch:
                values[nid] = self.fetch(job, nid)
        self.last_stats = {"job": self.last_job, "uploaded": uploaded, "nodes": len(cgraph),
                           "seconds": time.perf_counter() - t0}
        return [values[rename[t._id]] for t in outputs]

    # --- the REST calls --------------------------------------------------------------------

    def upload(self, arr: np.ndarray) -> str:
        """``POST /v1/tensors``: the array's raw little-endian C-order bytes; its id."""
        d = dt.dtype(arr.dtype)
        data = np.ascontiguousarray(arr, dtype=d.np.newbyteorder("<")).tobytes()
        r = self._call("POST", "/v1/tensors", content=data, retry_sent=True, headers={
            "X-Triplane-Shape": ",".join(str(int(s)) for s in arr.shape),
            "X-Triplane-Dtype": d.name, "Content-Type": "application/octet-stream"})
        return str(r.json()["id"])

    def submit(self, graph_doc: dict[str, Any], fetch: list[str]) -> str:
        """``POST /v1/jobs``; the job id. Never retried once the request may have arrived."""
        body = canonical_json({"graph": graph_doc, "fetch": fetch})
        r = self._call("POST", "/v1/jobs", content=body, headers={"Content-Type": "application/json"},
                       retry_sent=False)
        self.last_submit = r.json()
        self.last_job = str(self.last_submit["id"])
        return self.last_job

    def submit_bound(self, plan: str, args: list[Any], fetch: list[str]) -> str:
        """``POST /v1/jobs`` of a compiled step (``remote_steps.py``); the job id. A 409
        ``unknown plan`` RemoteError when the scheduler does not know ``plan``."""
        body = canonical_json({"plan": plan, "args": args, "fetch": fetch})
        r = self._call("POST", "/v1/jobs", content=body, headers={"Content-Type": "application/json"},
                       retry_sent=False)
        self.last_job = str(r.json()["id"])
        return self.last_job

    def upload_once(self, arr: np.ndarray) -> str:
        """The upload id of ``arr``, uploading it unless this session did before."""
        upload_id = self._uploads.get(arr)
        if upload_id is None:
            upload_id = self.upload(arr)
            self._uploads.put(arr, upload_id)
        return upload_id

    def wait(self, job: str) -> dict[str, Any]:
        """Long-poll until ``job`` ends; its status body when done, else the mapped error."""
        deadline = None if self.job_timeout_s is None else time.monotonic() + self.job_timeout_s
        while True:
            poll = self.poll_s
            if deadline is not None:
                poll = max(0.0, min(poll, deadline - time.monotonic()))
            body = self._call("GET", f"/v1/jobs/{job}/wait", params={"timeout": f"{poll:g}"},
                              retry_sent=True).json()
            state = body.get("state")
            if state == "done":
                return body
            if state == "failed":
                raise _job_error(job, body.get("error"))
            if state == "cancelled":
                raise RemoteError(f"job {job} was cancelled")
            if state not in ("queued", "running"):
                raise RemoteError(f"job {job}: the scheduler reports an unknown state {state!r}")
            if deadline is not None and time.monotonic() >= deadline:
                raise RemoteError(f"job {job} did not finish within {self.job_timeout_s:g} s "
                                  f"(state {state}, progress {body.get('progress')})")

    def fetch(self, job: str, node: str) -> np.ndarray:
        """``GET /v1/jobs/{job}/tensors/{node}`` as a read-only array."""
        r = self._call("GET", f"/v1/jobs/{job}/tensors/{node}", retry_sent=True)
        shape_h = r.headers.get("X-Triplane-Shape", "")
        try:
            shape = tuple(int(s) for s in shape_h.split(",") if s.strip())
            d = dt.dtype(r.headers.get("X-Triplane-Dtype", ""))
        except (ValueError, E.TriplaneError):
            raise RemoteError(f"job {job}: tensor {node} came with bad headers "
                              f"shape={shape_h!r} dtype={r.headers.get('X-Triplane-Dtype')!r}") from None
        want = int(np.prod(shape, dtype=np.int64)) * d.itemsize
        if len(r.content) != want:
            raise RemoteError(f"job {job}: tensor {node} is {len(r.content)} bytes, "
                              f"{d.name}{list(shape)} needs {want}")
        arr = np.frombuffer(r.content, dtype=d.np.newbyteorder("<")).astype(d.np, copy=False)
        arr = arr.reshape(shape)
        arr.flags.writeable = False
        return arr

    def counters(self) -> dict[str, int]:
        """Compiled steps sent as one small request (``trace_hits``), structures sent as a
        graph (``trace_misses``), and compiled steps the scheduler had forgotten."""
        c = self.steps.cache
        return {"trace_hits": c.hits, "trace_misses": c.misses, "unknown_plan": self.steps.fallbacks}

    def health(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/health", retry_sent=True).json())

    def nodes(self) -> list[dict[str, Any]]:
        """``GET /v1/nodes`` (also proves the token is accepted)."""
        body = self._call("GET", "/v1/nodes", retry_sent=True).json()
        return list(body["nodes"] if isinstance(body, dict) else body)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSession({self.url!r})"

    # --- plumbing ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, retry_sent: bool, **kw: Any) -> httpx.Response:
        """One request, retried while the scheduler is unreachable (or answers 503) for up
        to ``reconnect_s``. ``retry_sent=False`` retries only a refused connection."""
        import httpx

        deadline = time.monotonic() + self.reconnect_s
        delay = 0.05
        while True:
            try:
                r = self._client.request(method, path, **kw)
            except httpx.TransportError as e:
                retriable = retry_sent or isinstance(e, httpx.ConnectError)
                if not retriable or time.monotonic() + delay > deadline:
                    raise RemoteError(f"cannot reach the scheduler at {self.url} ({method} {path}): "
                                      f"{type(e).__name__}: {e}. Is the cluster up? (`triplane status`)"
                                      ) from None
            else:
                if r.status_code != 503 or time.monotonic() + delay > deadline:
                    break
            time.sleep(delay)
            delay = min(1.0, delay * 2)
        if r.status_code >= 400:
            raise _http_error(r, f"{method} {path}", self.url)
        return r


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


def _http_error(r: httpx.Response, what: str, url: str) -> E.TriplaneError:
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
    return RemoteError(f"{what} -> {r.status_code}: {err.get('message')}", status=r.status_code)


def _job_error(job: str, err: Any) -> E.TriplaneError:
    if isinstance(err, str):
        err = {"message": err}
    if not isinstance(err, dict):
        err = {"message": "the scheduler gave no reason"}
    mapped = _mapped(err, "infra")
    if mapped is None:
        return RemoteError(f"job {job} failed: {err.get('message')}")
    return mapped


# --- tp.connect --------------------------------------------------------------------------------

class LocalCluster(NamedTuple):
    """What the run directory of ``triplane up`` records: the cluster's URL (None when
    none is recorded) and token, and the directory's path (for error messages)."""

    url: str | None
    token: str | None
    where: str


# Reads the run directory. The launcher owns it and sits above the SDK, so the top of the
# package installs the lookup (triplane/embedded.py); without one, no cluster is recorded.
_local_cluster: Callable[[str | os.PathLike[str] | None], LocalCluster] | None = None


def set_local_cluster_lookup(lookup: Callable[[str | os.PathLike[str] | None], LocalCluster]) -> None:
    """Install what :func:`resolve_target` asks for the cluster of ``triplane up``."""
    global _local_cluster
    _local_cluster = lookup


def _recorded(home: str | os.PathLike[str] | None) -> LocalCluster:
    if _local_cluster is None:
        return LocalCluster(None, None, "the run directory (no lookup installed)")
    return _local_cluster(home)


def resolve_target(url: str | None = None, token: str | None = None,
                   home: str | os.PathLike[str] | None = None) -> tuple[str, str | None]:
    """Where to connect: the arguments, else ``TRIPLANE_URL`` / ``TRIPLANE_TOKEN``, else the
    run directory of ``triplane up`` (``home``, ``TRIPLANE_HOME``, default ``~/.triplane``).
    Raises :class:`RemoteError` naming all three places when none gives a URL."""
    url = url or os.environ.get("TRIPLANE_URL") or None
    token = token or os.environ.get("TRIPLANE_TOKEN") or None
    if url is None:
        found = _recorded(home)
        if found.url is None:
            raise RemoteError(f"no cluster to connect to: pass tp.connect(url, token), set TRIPLANE_URL, "
                              f"or start one with `triplane up` (nothing found in {found.where})")
        url = found.url
        token = token or found.token
    elif token is None:
        found = _recorded(home)
        if found.url is not None and found.url.rstrip("/") == url.rstrip("/"):
            token = found.token
    return url, token


def connect(url: str | None = None, token: str | None = None, *,
            home: str | os.PathLike[str] | Path | None = None,
            transport: httpx.BaseTransport | None = None, check: bool = True,
            **options: Any) -> RemoteSession:
    """Make ``.numpy()`` run on a cluster: sets (and returns) the process's default session.

    With no arguments, uses ``TRIPLANE_URL`` / ``TRIPLANE_TOKEN``, else the cluster that
    ``triplane up`` recorded in its run directory. With ``check`` (default) the scheduler
    is asked for its nodes at once, so a wrong URL or token fails here with a clear
    :class:`RemoteError` instead of at the first ``.numpy()``. ``options`` go to
    :class:`RemoteSession`. ``set_default_session(None)`` (triplane.sdk.session) goes back
    to the embedded session.
    """
    from triplane.sdk.session import set_default_session

    url, token = resolve_target(url, token, home)
    session = RemoteSession(url, token, transport, **options)
    if check:
        try:
            session.nodes()
        except BaseException:
            session.close()
            raise
    set_default_session(session)
    return session

