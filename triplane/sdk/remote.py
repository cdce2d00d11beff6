"""The remote session: ``.numpy()`` runs on a cluster (``tp.connect``).

A :class:`RemoteSession` evaluates tensors the way the embedded session does, but through
the scheduler's REST API (docs/runtime.md, "The REST API"):

1. build the graph and canonicalise it (the same bytes every SDK sends);
2. upload every host tensor it has not uploaded before (``POST /v1/tensors``), remembered
   by array identity with weak references, so a training loop sends each parameter
   value once and nothing is kept alive by the cache;
3. submit (``POST /v1/jobs`` with ``wait_s`` and ``inline``: a job that ends within
   ``wait_s`` answers with its small outputs, one request); else long-poll ``/wait``
   until it ends (a progress bar on a terminal after a second, ``lifecycle.ProgressBar``)
   and fetch each output (``GET /v1/jobs/{id}/tensors/{node}``);
4. release the job once its outputs are read (``DELETE /v1/jobs/{id}``, queued: the
   keeper thread of ``lifecycle.py`` sends it off the hot path) -- or, for outputs kept on
   the cluster (``realize(keep=...)``, optimiser steps), once no Tensor holds any of them
   (``remote_values.py``: resident values, checkpoints, restore after an executor loss).

Lifecycle. The session opens a client session lease (``POST /v1/sessions``) at its first
upload or submit and tags both with it (``X-Triplane-Session``); the keeper renews it. An
upload is released when its host array dies (its weakref callback queues the release), a
job when its outputs are fetched; :meth:`RemoteSession.close` (``tp.disconnect()``, and
process exit) releases what is left by ending the lease. A client that dies without a
word has its values freed by the scheduler when the lease expires.

Failure semantics. A request that does not reach the scheduler (connection refused or
reset, e.g. while it restarts) is retried with backoff for up to ``reconnect_s`` (3 s by
default: a stopped cluster is reported at once, not after a long hang); a submit is
retried only when the connection was refused, so a job is never submitted twice. Ctrl-C
while a job runs cancels it on the cluster and raises a plain ``KeyboardInterrupt``.
Server errors map back to the SDK's exceptions (``remote_errors.py``). Nothing here
parses untrusted data beyond JSON and raw little-endian bytes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto import errors as E
from triplane.proto.canonjson import canonical_json
from triplane.proto.infer import add_locs
from triplane.proto.ir import TensorType
from triplane.sdk.lifecycle import Keeper, ProgressBar, Uploads, deferred_interrupt
from triplane.sdk.remote_errors import RemoteError, job_error, lost_holder, request
from triplane.sdk.remote_steps import BoundSteps, decode_values, fetched_array
from triplane.sdk.remote_values import Holders, RemoteJob, RemoteValue, Resident, read_copy
from triplane.sdk.remote_wire import wire_for

if TYPE_CHECKING:
    import httpx

    from triplane.sdk.tensor import Tensor

__all__ = [
    "LocalCluster", "RemoteError", "RemoteSession", "connect", "disconnect", "resolve_target",
    "set_local_cluster_lookup",
]

log = logging.getLogger(__name__)

TERMINAL = ("done", "failed", "cancelled")
MAX_RELEASE = 1000  # releases one submit carries (the scheduler's bound, api/waiting.py)
CARRY_S = 1.0  # ... and how long one waits for a submit before the keeper sends a DELETE


class RemoteSession:
    """Evaluates graphs on the cluster whose scheduler answers at ``url``.

    ``transport`` is an ``httpx`` transport (tests pass ``httpx.MockTransport`` or an
    ASGI transport); by default a real HTTP connection pool (job submits on their own
    connections, ``remote_wire.py``). ``timeout_s`` bounds each
    HTTP request, ``reconnect_s`` how long an unreachable scheduler is retried, and
    ``job_timeout_s`` (None: no bound) how long one job may take before
    :class:`RemoteError`. ``lease`` (default) opens a client session lease so that the
    scheduler frees this session's values when it ends or dies; ``release`` (default)
    releases jobs once read (or once no value kept from them is alive) and uploads once
    their arrays die. ``wait_s``: how long a submit waits for its job to end, answering
    small outputs inline (one request per short step; 0: the submit answers at once).
    ``checkpoint_every``: how many optimiser steps apart the values kept on the cluster
    are copied to the scheduler's disk, so that a step whose executor died goes on from
    there (0: never; a lost executor then fails the step). ``pipeline``: a compiled step
    that keeps values does not wait for its job (``remote_pipeline.py``).
    Thread-safe.
    """

    def __init__(self, url: str, token: str | None, transport: httpx.BaseTransport | None = None, *,
                 timeout_s: float = 30.0, reconnect_s: float = 3.0, job_timeout_s: float | None = None,
                 poll_s: float = 10.0, lease: bool = True, release: bool = True, wait_s: float = 1.0,
                 checkpoint_every: int = 50, pipeline: bool = True) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.reconnect_s = reconnect_s
        self.job_timeout_s = job_timeout_s
        self.poll_s = poll_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                    timeout=httpx.Timeout(timeout_s, connect=min(2.0, timeout_s)))
        self._wire = wire_for(self.url, headers, min(2.0, timeout_s), timeout_s, transport)  # job submits
        self.release_values = release
        self.keeper = Keeper(self._send_release, self._renew)
        self._uploads = Uploads(self._upload_died if release else None)
        self.steps = BoundSteps(pipeline)  # compiled steps: structures the scheduler planned before
        self.wait_s = wait_s
        self.persist: str | None = None  # "file" or "redis": graph jobs keep their tiles there too
        self.prefer: str | None = None  # an executor's name: every job's tasks prefer it (docs/runtime.md)
        self._submitter: Any = None  # the helper thread of submits that wait (_post_job)
        self._submitted_at: float | None = None
        self.holders = Holders()  # the Tensors holding values kept on the cluster
        self.resident = Resident(self, checkpoint_every)
        self.last_submit: dict[str, Any] = {}
        self._want_lease = lease
        self.session_id: str | None = None
        self._lease_lock = threading.Lock()
        self._closed = False
        self.last_job: str | None = None
        self.last_stats: dict[str, Any] = {}
        self.keeper.carry_s = CARRY_S if release else 0.0  # releases ride on submits (_post_releasing)
        _open_sessions.add(self)

    # --- the session protocol ------------------------------------------------------------

    keeps_values = True  # realize(keep=...) leaves values here (tensor.realize)

    def evaluate(self, outputs: Sequence[Tensor], keep: Collection[int] = ()) -> list[Any]:
        """Compute ``outputs`` on the cluster; same values as the embedded session. The
        outputs at the positions ``keep`` stay on the cluster (a :class:`RemoteValue` each,
        fetched when read); the others come back as host arrays. A step whose inputs were
        lost with an executor is run again from the last checkpoint (``remote_values``)."""
        keep = frozenset(keep)
        try:
            if keep:
                self.resident.before_step()
            try:
                return self._evaluate(outputs, keep)
            except RemoteError as e:
                if e.kind != "lost":
                    raise
                self.steps.pipe.recover(self, e, in_step=bool(keep))  # (Resident.restore, and more)
                return self._evaluate(outputs, keep)
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None  # (the job was cancelled) a short, plain traceback

    def _evaluate(self, outputs: Sequence[Tensor], keep: frozenset[int]) -> list[Any]:
        from triplane.sdk.tensor import build_graph

        t0 = time.perf_counter()
        done, pending = self.steps.run(self, outputs, keep)  # a compiled step: one small request
        if done is not None:
            self.last_stats = {"job": self.last_job, "compiled": True, "seconds": time.perf_counter() - t0}
            return done
        graph, tensors, bindings = build_graph(outputs)
        cgraph, rename, args = graph.canonical()
        doc = json.loads(cgraph.to_json())  # the wire form (constants encoded as the IR says)
        add_locs(doc["nodes"], ((rename[tid], t._where) for tid, t in tensors.items() if tid in rename))
        uploaded = 0
        local: dict[str, Any] = {}  # canonical id -> value of input nodes
        upload_of: dict[str, str] = {}  # argN -> its upload or ref
        for nid, node in doc["nodes"].items():
            if node["op"] != "input":
                continue
            value = bindings[args[int(node["attrs"]["tensor"][3:])]]
            if isinstance(value, RemoteValue) and value.session is self:
                bound = value.ref
            else:
                arr = value if type(value) is np.ndarray else value.numpy()
                bound = self._uploads.get(arr)
                if bound is None:
                    try:
                        bound = self.upload(arr)
                    except KeyboardInterrupt:
                        raise KeyboardInterrupt from None  # Ctrl-C: no transport internals
                    self._uploads.put(arr, bound)
                    uploaded += 1
            upload_of[node["attrs"]["tensor"]] = bound
            node["attrs"]["tensor"] = bound
            local[nid] = value
        # An output that is itself an input needs no trip; the rest is fetched once each.
        fetch = list(dict.fromkeys(o for o in cgraph.outputs if o not in local))
        kept = {rename[t._id]: t._type for i, t in enumerate(outputs) if i in keep}
        for i, t in enumerate(outputs):
            if i not in keep:
                kept.pop(rename[t._id], None)  # also wanted here: fetched
        values: dict[str, Any] = dict(local)
        if fetch:
            learn = lambda: self.steps.learn(pending, self.last_submit, upload_of, args,  # noqa: E731
                                             rename, outputs, fetch)
            values.update(self._run_job(doc, fetch, kept, rename, tensors, learn))
        self.last_stats = {"job": self.last_job, "uploaded": uploaded, "nodes": len(cgraph),
                           "seconds": time.perf_counter() - t0}
        return [values[rename[t._id]] for t in outputs]

    def _run_job(self, doc: dict[str, Any], fetch: list[str], kept: Mapping[str, TensorType],
                 rename: dict[str, str], tensors: dict[str, Tensor], learn: Callable[[], None] | None = None,
                 ) -> dict[str, Any]:
        """Submit (then ``learn``: a compiled step remembers the structure), and collect."""
        inline = [n for n in fetch if n not in kept]
        try:
            answer = self.submit_job({"graph": doc, "fetch": fetch}, inline)
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None  # the user pressed Ctrl-C: no transport internals
        if learn is not None:
            learn()
        try:
            return self.finish(answer, fetch, kept,
                               resubmit=lambda: self.submit_job({"graph": doc, "fetch": fetch}, inline))
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None  # (finish cancelled the job) a traceback one frame shorter
        except E.KernelError as e:
            from triplane.sdk.session import locate_kernel_error

            raise locate_kernel_error(e, rename, tensors) from None

    def finish(self, answer: dict[str, Any], fetch: Sequence[str],
               kept: Mapping[str, TensorType] | None = None,
               resubmit: Callable[[], dict[str, Any]] | None = None, wait: bool = True) -> dict[str, Any]:
        """The values of a submitted job (``answer``: its submit response): those in
        ``fetch`` but not ``kept`` as host arrays (inline in the answer when the job ended
        within ``wait_s``, else waited for and fetched), the ``kept`` ones as
        :class:`RemoteValue` (the job is released when the last of them dies; with none
        kept, at once). Ctrl-C cancels the job and raises a plain ``KeyboardInterrupt``.
        An output whose executor died after the job ended is computed again: ``resubmit``
        submits the same job once more."""
        kept = kept or {}
        job = str(answer["id"])
        keep_job = False
        try:
            state = answer.get("state")
            if state == "failed":
                raise job_error(job, answer.get("error"))
            if state == "cancelled":
                raise RemoteError(f"job {job} was cancelled")
            if state != "done" and wait:  # (not for a pipelined step: all its outputs are kept)
                self.wait(job)
            inline = decode_values(answer.get("values"))
            out: dict[str, Any] = {n: inline[n] if n in inline else self.fetch(job, n)
                                   for n in fetch if n not in kept}
            if kept:
                holder = RemoteJob(self, job)
                out.update((n, RemoteValue(self, f"{job}:{n}", ty, holder)) for n, ty in kept.items())
                keep_job = True
            return out
        except RemoteError as e:
            if resubmit is None or not lost_holder(e):
                raise
            log.warning("job %s: an output's executor is gone (%s); running the job again", job, e)
            return self.finish(resubmit(), fetch, kept)
        except KeyboardInterrupt:
            self.interrupted(job)
            raise KeyboardInterrupt from None  # the user pressed Ctrl-C: no transport internals
        finally:
            if self.release_values and not keep_job:
                self.keeper.queue("jobs", job)

    def fetch_value(self, value: RemoteValue) -> np.ndarray:
        """The host copy of a value kept on the cluster (a job's output or an upload)."""
        if self._closed:
            raise RemoteError(f"{value} was held by the cluster session {self.url}, which is closed: "
                              "read values (.numpy(), state_dict()) before tp.disconnect()")
        if value.job is None:  # an upload (a checkpoint copy)
            return read_copy(self, value)
        self.steps.pipe.settle(self, value)  # a value of the pipelined step in flight: once it ended
        if value.host is not None:  # (a deferred output: settling fetched it)
            return value.host
        job, node = value.ref.split(":", 1)
        return self.fetch(job, node)

    def job_unused(self, job: str) -> None:
        """No value of ``job`` is alive any more: queue its release (a finalizer: no I/O)."""
        if not self._closed:
            self.keeper.queue("jobs", job)

    # --- the REST calls --------------------------------------------------------------------

    def upload(self, arr: np.ndarray) -> str:
        """``POST /v1/tensors``: the array's raw little-endian C-order bytes; its id."""
        d = dt.dtype(arr.dtype)
        data = np.ascontiguousarray(arr, dtype=d.np.newbyteorder("<")).tobytes()
        r = self._call("POST", "/v1/tensors", content=data, retry_sent=True, headers={
            "X-Triplane-Shape": ",".join(str(int(s)) for s in arr.shape),
            "X-Triplane-Dtype": d.name, "Content-Type": "application/octet-stream", **self._lease_header()})
        return str(r.json()["id"])

    def submit(self, graph_doc: dict[str, Any], fetch: list[str]) -> str:
        """``POST /v1/jobs``; the job id. Never retried once the request may have arrived."""
        return str(self.submit_job({"graph": graph_doc, "fetch": fetch})["id"])

    def submit_job(self, request: dict[str, Any], inline: Sequence[str] | None = None, *,
                   hold: bool = False) -> dict[str, Any]:
        """``POST /v1/jobs`` of a graph (``{"graph", "fetch"}``) or a compiled step
        (``{"plan", "args", "fetch"}``, ``remote_steps.py``); the response. With ``inline``
        (names in ``fetch``) the scheduler answers when the job ends or after ``wait_s``,
        with those outputs of at most 64 KiB in ``values``: a short step is ONE request.
        Never retried once the request may have arrived. A 409 ``unknown plan`` RemoteError
        when the scheduler does not know a compiled step's ``plan``."""
        if self.persist is not None and "graph" in request:
            request = {**request, "persist": self.persist}
        if self.prefer is not None:
            request = {**request, "prefer": self.prefer}
        body = request
        self._submitted_at = time.monotonic()
        if inline is not None and self.wait_s:
            from triplane.sdk import lifecycle

            # On a terminal a job longer than the bar's delay is polled, so that its bar shows.
            wait_s = min(self.wait_s, lifecycle.DELAY_S) if lifecycle.progress_enabled() else self.wait_s
            body = {**request, "wait_s": wait_s, "inline": list(inline)}
        waits = body is not request or hold  # (hold: a pipelined step, which may wait for the one before)
        try:
            r = self._post_releasing(body, waits)
        except RemoteError as e:
            if not waits or e.status != 400 or "wait_s" not in str(e):
                raise
            self.wait_s = 0  # a scheduler that predates wait_s refused the request: poll instead
            r = self._call("POST", "/v1/jobs", content=canonical_json(request), retry_sent=False,
                           headers={"Content-Type": "application/json", **self._lease_header()})
        answer = r.json()
        if "graph" in request:
            self.last_submit = answer
        self.last_job = str(answer["id"])
        return dict(answer)

    def _post_releasing(self, body: dict[str, Any], waits: bool) -> Any:
        """``POST /v1/jobs`` carrying the queued releases (a step frees the one before, and
        the uploads that died meanwhile)."""
        release = self.keeper.take(MAX_RELEASE) if self.keeper.carry_s else []
        if not release:
            return self._post_job(body, waits)
        try:
            return self._post_job({**body, "release": [ident for _, ident in release]}, waits)
        except RemoteError as e:
            self.keeper.put_back(release)
            if e.status != 400 or "'release'" not in str(e):
                raise
            self.keeper.carry_s = 0.0  # a scheduler that predates "release": DELETEs from now on
        except BaseException:
            self.keeper.put_back(release)
            raise
        return self._post_job(body, waits)  # (without them)

    def _post_job(self, body: dict[str, Any], waits: bool) -> Any:
        """``POST /v1/jobs`` (``_post``). A Ctrl-C during a submit that waits (``wait_s``)
        still learns the job's id and cancels it: held back until the answer comes
        (``deferred_interrupt``), or else with the submit on a helper thread."""
        headers = {"Content-Type": "application/json", **self._lease_header()}
        if not waits:
            return self._post(canonical_json(body), headers)
        content = canonical_json(body)
        with deferred_interrupt() as held:
            if held is not None:
                try:
                    r = self._post(content, headers)
                except Exception:
                    if held.pressed:
                        raise KeyboardInterrupt from None
                    raise
                if held.pressed:
                    self.interrupted(str(r.json().get("id")))
                    raise KeyboardInterrupt from None
                return r
        if self._submitter is None:
            from concurrent.futures import ThreadPoolExecutor

            self._submitter = ThreadPoolExecutor(1, thread_name_prefix="triplane-submit")
        pending = self._submitter.submit(self._post, content, headers)
        try:
            return pending.result()
        except KeyboardInterrupt:
            try:
                job = pending.result(timeout=self.wait_s + 10.0).json().get("id")
            except BaseException as e:  # the submit failed, or another Ctrl-C: nothing to cancel
                log.debug("after Ctrl-C, the submit gave no job: %s", e)
            else:
                if job:
                    self.interrupted(str(job))
            raise KeyboardInterrupt from None

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
        since = self._submitted_at if job == self.last_job else None  # counts the submit's wait_s
        bar = ProgressBar(job, since)
        try:
            return self._wait(job, deadline, bar)
        finally:
            bar.close()

    def _wait(self, job: str, deadline: float | None, bar: ProgressBar) -> dict[str, Any]:
        from triplane.sdk.lifecycle import progress_enabled

        while True:
            # With a bar, poll often enough to move it; the first poll is short either way.
            poll = min(self.poll_s, 0.5) if progress_enabled() else self.poll_s
            if deadline is not None:
                poll = max(0.0, min(poll, deadline - time.monotonic()))
            body = self._call("GET", f"/v1/jobs/{job}/wait", params={"timeout": f"{poll:g}"},
                              retry_sent=True).json()
            state = body.get("state")
            bar.update(body.get("progress"))
            if state == "done":
                return body
            if state == "failed":
                raise job_error(job, body.get("error"))
            if state == "cancelled":
                raise RemoteError(f"job {job} was cancelled")
            if state not in ("queued", "running"):
                raise RemoteError(f"job {job}: the scheduler reports an unknown state {state!r}")
            if deadline is not None and time.monotonic() >= deadline:
                raise RemoteError(f"job {job} did not finish within {self.job_timeout_s:g} s "
                                  f"(state {state}, progress {body.get('progress')})")

    def fetch(self, job: str, node: str) -> np.ndarray:
        """``GET /v1/jobs/{job}/tensors/{node}`` as a read-only array."""
        return fetched_array(self._call("GET", f"/v1/jobs/{job}/tensors/{node}", retry_sent=True), job, node)

    def copy_values(self, refs: Sequence[str]) -> list[str]:
        """``POST /v1/tensors/copy``: each ref's value copied into the scheduler's upload
        store (its disk; owned by this session's lease), in batches of 1,000; their ids."""
        ids: list[str] = []
        for i in range(0, len(refs), 1000):
            body = canonical_json({"from": list(refs[i:i + 1000])})
            r = self._call("POST", "/v1/tensors/copy", content=body, retry_sent=True,
                           headers={"Content-Type": "application/json", **self._lease_header()})
            ids.extend(str(u) for u in r.json()["ids"])
        return ids

    def counters(self) -> dict[str, int]:
        return self.steps.counters()  # the compiled steps' (BoundSteps.counters)

    def health(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/health", retry_sent=True).json())

    def nodes(self) -> list[dict[str, Any]]:
        """``GET /v1/nodes``, every page (also proves the token is accepted)."""
        nodes, page = [], {"next": ""}
        while page["next"] is not None:  # pages of up to 1000, each from the last one's cursor
            more = {"cursor": page["next"]} if page["next"] else {}
            page = self._call("GET", "/v1/nodes", retry_sent=True, params={"limit": 1000, **more}).json()
            nodes += page["items"]
        return nodes

    def cancel(self, job: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``: cancel a running job and release its tiles."""
        return dict(self._call("DELETE", f"/v1/jobs/{job}", retry_sent=True).json())

    def release_upload(self, upload_id: str) -> None:
        """``DELETE /v1/tensors/{id}``: delete an upload on the scheduler and its executors."""
        self._call("DELETE", f"/v1/tensors/{upload_id}", retry_sent=True)

    def close(self, download: bool = False) -> None:
        """Release everything this session holds (queued releases, then the lease: the
        scheduler frees its uploads and jobs) and close the connection. Idempotent; a
        scheduler that is gone is not waited for (its lease expires anyway). With
        ``download`` (``tp.disconnect()``), every value kept on the cluster that a Tensor
        still holds is fetched first (one request each), so the model goes on in-process;
        without, reading such a value afterwards raises :class:`RemoteError`."""
        if self._closed:
            return
        if download:
            for t, v in list(self.holders.live(self)):
                try:
                    t._value = v.numpy()
                except RemoteError as e:  # lost with its executor: it stays unreadable
                    log.warning("tp.disconnect(): could not fetch %s: %s", v, e)
        self._closed = True
        _open_sessions.discard(self)
        self.keeper.close()
        try:
            sid, self.session_id = self.session_id, None
            if sid is not None:  # one request releases everything the lease holds
                self.keeper.drop()
                self._client.request("DELETE", f"/v1/sessions/{sid}", timeout=5.0)
            else:
                self.keeper.flush(give_up_on_error=True)
        except Exception as e:  # unreachable: the lease frees it
            log.debug("closing the session on %s: %s", self.url, e)
        self._uploads.clear()
        if self._submitter is not None:
            self._submitter.shutdown(wait=False)
        self._client.close()
        if self._wire is not None:
            self._wire.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSession({self.url!r})"

    # --- the lease and releases ---------------------------------------------------------------

    def _lease_header(self) -> dict[str, str]:
        """``X-Triplane-Session`` of the lease, opened on first use (none if the scheduler
        predates leases or the token may not open one)."""
        if not self._want_lease:
            return {}
        with self._lease_lock:
            if self.session_id is None:
                try:
                    body = self._call("POST", "/v1/sessions", retry_sent=True).json()
                except RemoteError as e:
                    if e.status in (403, 404, 405):
                        self._want_lease = False
                        return {}
                    raise
                self.session_id = str(body["id"])
                self.keeper.heartbeat(max(0.05, float(body.get("ttl_s", 30.0)) / 3))
            return {"X-Triplane-Session": self.session_id}

    def _renew(self) -> None:
        sid = self.session_id
        if sid is None:
            return
        try:
            self._call("POST", f"/v1/sessions/{sid}/renew", retry_sent=True)
        except RemoteError as e:
            if e.status != 404:
                raise
            # The lease expired (this process was stopped longer than its TTL): the scheduler
            # freed our uploads, so forget them; the next request opens a new lease.
            log.warning("the session lease %s expired; its uploads were freed and will be sent again", sid)
            with self._lease_lock:
                self._uploads.clear()
                self.session_id = None

    def _upload_died(self, upload_id: str) -> None:
        if not self._closed:
            self.keeper.queue("tensors", upload_id)

    def _send_release(self, kind: str, ident: str) -> None:
        try:
            self._call("DELETE", f"/v1/{kind}/{ident}", retry_sent=True)
        except RemoteError as e:
            if e.status != 404:  # released already (the lease ended): nothing to do
                raise

    def interrupted(self, job: str) -> None:
        """Ctrl-C while ``job`` runs: cancel it (one quick try; the lease is the fallback)."""
        try:
            self._client.request("DELETE", f"/v1/jobs/{job}", timeout=3.0)
        except Exception as e:
            log.debug("cancelling %s after Ctrl-C failed: %s", job, e)

    # --- plumbing ---------------------------------------------------------------------------

    def _post(self, content: bytes, headers: dict[str, str]) -> Any:
        """``POST /v1/jobs``, on the submits' own connections where there are (``remote_wire``)."""
        if self._wire is None:
            return self._call("POST", "/v1/jobs", content=content, retry_sent=False, headers=headers)
        return self._wire.post("/v1/jobs", content, headers, self.reconnect_s)

    def _call(self, method: str, path: str, *, retry_sent: bool, **kw: Any) -> httpx.Response:
        """One request, retried while the scheduler is unreachable (``remote_errors.request``)."""
        return request(self._client, self.url, self.reconnect_s, method, path, retry_sent=retry_sent, **kw)


_open_sessions: weakref.WeakSet[RemoteSession] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At exit, release what every open session holds (a killed process: the lease does)."""
    for s in list(_open_sessions):
        with contextlib.suppress(Exception):  # exiting anyway
            s.close()


# tp.connect lives beside the session (remote_connect.py); these names stay importable here.
from triplane.sdk.remote_connect import (  # noqa: E402
    LocalCluster,
    connect,
    disconnect,
    resolve_target,
    set_local_cluster_lookup,
)
