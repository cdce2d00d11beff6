"""The served model: its versions, the replicas that run batches, and reloading.

A *replica* is a thread with its own session (a cluster session from ``tp.connect``'s
machinery, or an embedded one) and its own copy of the model, loaded once: on a cluster
its parameters are uploaded once and bound by id in every step, the executors keep their
tiles cached (``scheduler/residency.py``), and every batch size the batcher uses (its
buckets) is run once at load, so each later predict is one small compiled-step request
binding the batch to a cached plan (``sdk/remote_steps.py``). Replicas take batches
from one :class:`~triplane.serving.batcher.Batcher`.

Spread. On a cluster each replica prefers one executor (:func:`spread_replicas`: round
robin over the executors up, by name, when the model is loaded): every job it sends
names it (``prefer``), so the warm-up leaves that replica's parameters cached there and
its batches run there, and 2 replicas on 2 executors keep both busy. A preference is not
a pin: while its executor is down (SIGKILLed, drained) the scheduler places the
replica's jobs elsewhere, and a reload spreads the replicas again over the executors up.

Reload. :meth:`ModelHost.reload` loads the new file into every replica's session and
warms it *beside* the version in service; then one assignment makes it current. A batch
that started on the old version finishes on it, every later batch runs the new one, and
requests waiting in the queue are not touched: none is dropped. A new version must have
the same signature (409 ``conflict`` otherwise: the HTTP API's schema is the
signature's); a file that does not load (corrupt, tampered...) leaves the old version in
service and the error names why.

Failures. A batch whose run fails with a transient error (an executor lost mid-step, the
cluster briefly unreachable) is run again, at most ``retries`` times with a short backoff;
other errors (a kernel error) fail the batch's requests at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import ModelFileError, TriplaneError
from triplane.scheduler.errors import Conflict, SchedulerError, Unavailable
from triplane.sdk.session import use_session
from triplane.sdk.tensor import Tensor, realize
from triplane.serving.batcher import Answer, Batch, Batcher, buckets
from triplane.serving.metrics import ServeMetrics
from triplane.serving.signature import Spec, batchable, check_inputs, specs_of

__all__ = ["ModelHost", "Version"]

log = logging.getLogger(__name__)

TRANSIENT_KINDS = frozenset({"lost", "unavailable", "standby"})


def transient(e: BaseException) -> bool:
    """Whether running the same batch again may succeed."""
    kind = getattr(e, "kind", None)
    status = getattr(e, "status", None)
    if kind in TRANSIENT_KINDS or status in (410, 502, 503, 504):
        return True
    return type(e).__module__.startswith("httpx") or isinstance(e, (ConnectionError, TimeoutError))


@dataclass
class Version:
    """One loaded model version: its id (the first 12 hex digits of the model's digest),
    file, signature and one model per replica."""

    version: str
    path: Path
    inputs: list[Spec]
    outputs: list[Spec]
    models: list[Any]
    kept: list[Any] = field(default_factory=list)  # what pin() returned: alive as long as the version
    loaded_at: float = field(default_factory=time.time)

    @property
    def batchable(self) -> bool:
        return batchable(self.inputs, self.outputs)


def pin_params(model: Any, session: Any) -> list[np.ndarray]:
    """Make ``model``'s parameters resident in a cluster ``session``: each is uploaded once
    and its Tensor holds the upload's id (a :class:`RemoteValue`), so every step binds it by
    id (nothing travels; executors keep its tiles cached) instead of sending small ones
    inline with each request. Returns the uploaded arrays: the session releases an upload
    when its array dies, so the caller keeps them as long as the model serves. A session
    without uploads (the embedded one) is left alone."""
    upload = getattr(session, "upload_once", None)
    if upload is None:
        return []
    from triplane.sdk.remote_values import RemoteValue

    inputs = {f"input:{s.name}" for s in model.signature.inputs}  # as Model.__call__ binds them
    kept = []
    for node in model.graph.nodes.values():
        name = node.attrs.get("tensor") if node.op == "input" else None
        if name is None or name in inputs:
            continue
        t = model._value(name)  # the Tensor the model binds this parameter to, made once
        if isinstance(t._value, np.ndarray):
            arr = t._value
            t._value = RemoteValue(session, upload(arr), t._type)
            kept.append(arr)
    return kept


def spread_replicas(sessions: Sequence[Any]) -> list[str | None]:
    """Give each cluster session (``.nodes()``, ``.prefer``) an executor to prefer: the
    executors up and not drained (``GET /v1/nodes``), by name, round robin; what each got.
    Sessions without executors (embedded) or a cluster with none up are left alone."""
    if not sessions or not all(hasattr(s, "prefer") and hasattr(s, "nodes") for s in sessions):
        return [None] * len(sessions)
    names = sorted(n["node"] for n in sessions[0].nodes() if n.get("health") == "up" and not n.get("drained"))
    if not names:
        return [None] * len(sessions)
    for i, session in enumerate(sessions):
        session.prefer = names[i % len(names)]
    return [s.prefer for s in sessions]


def run_model(model: Any, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The model's outputs on ``arrays`` in the current session, as host arrays."""
    out = model(*arrays)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    tensors = [o for o in outs if isinstance(o, Tensor)]
    if tensors:
        realize(*tensors)
    return [np.asarray(o.numpy() if isinstance(o, Tensor) else o) for o in outs]


class ModelHost:
    """The model in service behind a batcher, run by ``replicas`` threads.

    ``loader(path, key)`` loads a model file (``tp.load_model``); ``sessions()`` makes one
    session per replica; ``pin(model, session)`` makes a loaded model's parameters resident
    in that session (:func:`pin_params`; what it returns is kept with the version). Start
    with :meth:`start`, stop with :meth:`close`.
    """

    def __init__(self, path: str | Path, *, loader: Callable[..., Any], sessions: Callable[[], Any],
                 replicas: int = 1, max_batch: int = 32, max_wait_s: float = 0.005, retries: int = 2,
                 key: Any = None, pin: Callable[[Any, Any], Any] | None = pin_params,
                 metrics: ServeMetrics | None = None, warm: bool = True) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.path = Path(path)
        self._loader, self._pin, self._key = loader, pin, key
        self.replicas, self.retries, self.warm = replicas, retries, warm
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.metrics = metrics or ServeMetrics()
        self.sessions = [sessions() for _ in range(replicas)]
        self.current: Version | None = None
        self.batcher: Batcher | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._reloading = threading.Lock()

    # --- loading ---------------------------------------------------------------------

    def _load(self, path: Path) -> Version:
        placed = spread_replicas(self.sessions)
        if any(placed):
            log.info("replicas prefer executors %s", placed)
        version = ""
        models, kept, inputs, outputs = [], [], None, None
        for session in self.sessions:
            with use_session(session):
                model = self._loader(path, key=self._key)
                if self._pin is not None:
                    kept.append(self._pin(model, session))
            models.append(model)
            inputs = inputs or specs_of(model.signature.inputs)
            outputs = outputs or specs_of(model.signature.outputs)
            digest = getattr(model, "digest", None)
            if isinstance(digest, str):  # the manifest's SHA-256 covers the whole model
                version = digest[:12]
        assert inputs is not None and outputs is not None
        v = Version(version, path, inputs, outputs, models, kept)
        if self.warm:
            self._warm(v)
        return v

    def _warm(self, v: Version) -> None:
        """Run every bucket once per replica (compiles and caches its plan)."""
        if any(d is None for s in v.inputs for d in s.shape[1:]):
            return  # other dynamic dimensions: sizes are not known in advance
        sizes = buckets(self.max_batch) if v.batchable and self.max_batch > 1 else [1]
        for model, session in zip(v.models, self.sessions):
            with use_session(session):
                for n in sizes:
                    arrays = [np.zeros(tuple(n if d is None else d for d in s.shape), dt.dtype(s.dtype).np)
                              for s in v.inputs]
                    run_model(model, arrays)

    def start(self) -> Version:
        """Load the model (every replica), then start the replicas."""
        v = self._load(self.path)
        self.current = v
        self.batcher = Batcher(self.max_batch, self.max_wait_s, batching=v.batchable)
        self.metrics.model_loaded(v.version)
        for i in range(self.replicas):
            t = threading.Thread(target=self._replica, args=(i,), name=f"triplane-serve-replica-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        log.info("serving %s (version %s) with %d replica(s)", v.path, v.version, self.replicas)
        return v

    def reload(self, path: str | Path | None = None) -> Version:
        """Load ``path`` (default: the file served, re-read) and put it in service without
        dropping a request; the new :class:`Version`. Conflict (409) if it does not load
        (missing, corrupted, tampered...: the old version stays) or its signature differs."""
        with self._reloading:
            old = self.current
            assert old is not None, "start() first"
            new_path = Path(path) if path is not None else old.path
            try:
                v = self._load(new_path)
            except (ModelFileError, OSError) as e:
                raise Conflict(f"cannot load {new_path} ({getattr(e, 'kind', type(e).__name__)}: {e}); "
                               f"version {old.version} stays in service") from None
            if (v.inputs, v.outputs) != (old.inputs, old.outputs):
                def shown(v: Version) -> str:
                    return f"{[s.describe() for s in v.inputs]} -> {[s.describe() for s in v.outputs]}"

                raise Conflict(f"the model at {new_path} has another signature ({shown(v)}; serving "
                               f"{shown(old)}): start a new server for it")
            self.current = v  # one assignment: the next batch runs the new version
            self.path = new_path
            self.metrics.model_loaded(v.version)
            log.info("reloaded %s: version %s -> %s", new_path, old.version, v.version)
            return v

    # --- serving -------------------------------------------------------------------------

    def predict(self, given: dict[str, Any]) -> Future[Answer]:
        """Check ``given`` (name -> array, nested lists or tensor form) against the
        signature and queue it; a future of its :class:`Answer` (the outputs in signature
        order, and the version that computed them). The checks'
        domain errors name the input at fault."""
        v, b = self.current, self.batcher
        assert v is not None and b is not None, "start() first"
        arrays = check_inputs(v.inputs, given, self.max_batch if b.batching else None)
        rows = arrays[0].shape[0] if arrays and b.batching else 1
        return b.submit(arrays, rows)

    def _replica(self, i: int) -> None:
        session = self.sessions[i]
        assert self.batcher is not None
        while not self._stop.is_set():
            batch = self.batcher.next_batch(0.2)
            if batch is None:
                continue
            v = self.current
            assert v is not None
            self._run(i, v, session, batch)

    def _run(self, i: int, v: Version, session: Any, batch: Batch) -> None:
        started = time.perf_counter()
        for attempt in range(self.retries + 1):
            try:
                with use_session(session):
                    outs = run_model(v.models[i], batch.arrays)
                break
            except Exception as e:
                if attempt < self.retries and transient(e):
                    self.metrics.retries.inc()
                    log.warning("replica %d: batch of %d failed (%s); retry %d of %d", i, batch.rows, e,
                                attempt + 1, self.retries)
                    time.sleep(0.05 * 2 ** attempt)
                    continue
                log.warning("replica %d: batch of %d failed: %s", i, batch.rows, e)
                batch.fail(e if isinstance(e, TriplaneError) else
                           SchedulerError(f"the model failed on this batch: {type(e).__name__}: {e}"))
                return
        self.metrics.batch_done(batch.rows, batch.size, len(batch.requests), time.perf_counter() - started)
        batch.split(outs, v.version)

    def close(self) -> None:
        """Stop taking batches, fail what still waits, stop the replicas and close their
        sessions."""
        if self.batcher is not None:
            self.batcher.close()
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        if self.batcher is not None:
            self.batcher.fail_waiting(Unavailable("the model server stopped"))
        for s in self.sessions:
            close = getattr(s, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as e:  # a gone cluster: its leases expire anyway
                    log.debug("closing a replica session: %s", e)
