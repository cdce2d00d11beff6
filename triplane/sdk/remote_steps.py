"""Compiled steps on a cluster: a graph whose structure the scheduler compiled before is
sent as one small request binding new inputs to that plan (``POST /v1/jobs`` with
``{"plan", "args", "fetch"}``, docs/runtime.md "Compiled steps") instead of the graph.

The first run of a structure goes the full way (``RemoteSession.evaluate``: canonical
graph, uploads, submit); the scheduler answers with its plan's hash and which upload it
bound to each ``argN``, and :meth:`BoundSteps.learn` keeps, under the structure's
:func:`~triplane.sdk.compile.signature`, which walked input feeds each ``argN``. A later
run with the same signature skips building, canonicalising and serialising the graph:
inputs of at most ``INLINE_MAX_BYTES`` travel inside the request (base64), bigger ones are
uploaded (once per array, as before). If the scheduler no longer knows the plan (409
``unknown_plan``: restarted, evicted) the entry is dropped and the step goes the full way.

A compiled step that keeps values on the cluster (an optimiser's ``step()``) is pipelined:
submitted without waiting for its job (``remote_pipeline.py``). ``RemoteSession(pipeline=False)``: never.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import TriplaneError
from triplane.proto.values import encode_data
from triplane.sdk.compile import TraceCache, signature
from triplane.sdk.remote_pipeline import Pipeline
from triplane.sdk.remote_values import RemoteValue

if TYPE_CHECKING:
    import httpx

    from triplane.sdk.remote import RemoteSession
    from triplane.sdk.tensor import Tensor

INLINE_MAX_BYTES = 64 * 1024  # the scheduler's limit (scheduler/api/bound.py)


@dataclass(frozen=True)
class BoundStep:
    plan: str  # the scheduler's hash of the canonical graph
    args: tuple[int, ...]  # argN <- the walk's input at this position
    fetch: tuple[str, ...]  # the names the first submit fetched, in its order
    outputs: tuple[tuple[bool, Any], ...]  # per output: (True, fetched name) or (False, input position)


class BoundSteps:
    """The remote session's compiled steps (``hits`` / ``misses`` as every trace cache)."""

    def __init__(self, pipeline: bool = True) -> None:
        self.cache: TraceCache[BoundStep] = TraceCache()
        self.fallbacks = 0  # steps the scheduler did not know any more
        self.pipe = Pipeline(pipeline)

    def counters(self) -> dict[str, int]:
        """Compiled steps sent as one small request (``trace_hits``), structures sent as a
        graph (``trace_misses``), compiled steps the scheduler had forgotten, and those
        submitted without waiting (``pipelined``)."""
        c = self.cache
        return {"trace_hits": c.hits, "trace_misses": c.misses, "unknown_plan": self.fallbacks,
                "pipelined": self.pipe.pipelined}

    def run(self, session: RemoteSession, outputs: Sequence[Tensor], keep: frozenset[int] = frozenset()
            ) -> tuple[list[Any] | None, Any]:
        """The outputs' values if the structure is known (one small request), else None;
        and what :meth:`learn` needs after the full path. Outputs at ``keep`` stay on the
        cluster (RemoteValue), the others come back inline or fetched."""
        from triplane.sdk.remote import RemoteError

        key, _, inputs = signature(outputs)
        step = self.cache.get(key)
        pipelined = step is not None and self.pipe.wants(key, keep)
        if not pipelined:
            self.pipe.settle(session)  # a job of another kind: the step in flight ends first
        if step is None:
            return None, (key, inputs)
        args = [bind_arg(session, inputs[p]._value) for p in step.args]
        if pipelined:
            got = self.pipe.submit(session, key, step, inputs, outputs, keep, args)
            if got is None:
                self.fallbacks += 1
                self.cache.drop(key)  # learn() refills it after the full path
                return None, (key, inputs)
            return [got[v] if fetched else inputs[v]._value for fetched, v in step.outputs], None
        kept = {v: outputs[i]._type for i, (fetched, v) in enumerate(step.outputs) if fetched and i in keep}
        for i, (fetched, v) in enumerate(step.outputs):
            if fetched and i not in keep:
                kept.pop(v, None)  # also wanted on the host
        request = {"plan": step.plan, "args": args, "fetch": list(step.fetch)}
        inline = [n for n in step.fetch if n not in kept]
        try:
            answer = session.submit_job(request, inline)
        except RemoteError as e:
            if e.status != 409 or "unknown plan" not in str(e):
                raise
            self.fallbacks += 1
            self.cache.drop(key)  # learn() refills it after the full path
            return None, (key, inputs)
        got = session.finish(answer, step.fetch, kept,  # a lost output: the same step once more
                             resubmit=lambda: session.submit_job(request, inline))
        return [got[v] if fetched else inputs[v]._value for fetched, v in step.outputs], None

    def learn(self, pending: Any, answer: dict[str, Any], upload_of: dict[str, str], args: list[str],
              rename: dict[str, str], outputs: Sequence[Tensor], fetch: list[str]) -> None:
        """Remember the structure a full submit compiled. ``upload_of``: client
        argument name (``argN``) -> upload id; ``args``: the client's bound tensor ids (canonical order);
        ``answer``: the submit's response (``plan``, ``args``). Ambiguous bindings (one
        upload bound twice) are not learnt: those steps keep going the full way."""
        plan, server_args = answer.get("plan"), answer.get("args")
        if pending is None or not isinstance(plan, str) or not isinstance(server_args, list):
            return
        key, inputs = pending
        at = {t._id: i for i, t in enumerate(inputs)}
        pos_of: dict[str, int] = {}
        for i, tid in enumerate(args):
            upload = upload_of.get(f"arg{i}")
            if upload is None:
                continue
            if upload in pos_of:
                return
            pos_of[upload] = at[tid]
        if any(u not in pos_of for u in server_args):
            return
        out: list[tuple[bool, Any]] = []
        for t in outputs:
            cid = rename[t._id]
            out.append((True, cid) if cid in fetch else (False, at[t._id]))
        self.cache.put(key, BoundStep(plan, tuple(pos_of[u] for u in server_args), tuple(fetch), tuple(out)))


def bind_arg(session: RemoteSession, arr: Any) -> Any:
    """What a compiled step's ``args`` carry for a walked input's value: a ref for a value
    kept on this session's cluster, a small array inline, else its upload id."""
    if isinstance(arr, RemoteValue):
        if arr.session is session:
            return arr.ref  # kept on the cluster: bound by its ref, nothing travels
        arr = arr.numpy()  # another session's value
    assert arr is not None
    if arr.nbytes <= INLINE_MAX_BYTES:  # the bytes a constant node's data holds
        return {"shape": list(arr.shape), "dtype": dt.dtype(arr.dtype).name, "data": encode_data(arr)}
    return session.upload_once(arr)


def decode_values(values: Any) -> dict[str, np.ndarray]:
    """The ``values`` of a submit answered with ``wait_s``: name -> read-only array (each
    ``{"shape", "dtype", "data": base64 of raw little-endian C-order bytes}``)."""
    from triplane.sdk.remote import RemoteError

    out: dict[str, np.ndarray] = {}
    if not isinstance(values, dict):
        return out
    for name, v in values.items():
        try:
            d = dt.dtype(v["dtype"])
            shape = tuple(int(s) for s in v["shape"])
            raw = base64.b64decode(v["data"], validate=True)
        except (KeyError, TypeError, ValueError) as e:
            raise RemoteError(f"the scheduler sent a malformed inline value {name!r}: {e}") from None
        if len(raw) != int(np.prod(shape, dtype=np.int64)) * d.itemsize:
            raise RemoteError(f"inline value {name!r}: {len(raw)} bytes for {d.name}{list(shape)}")
        arr = np.frombuffer(raw, dtype=d.np.newbyteorder("<")).astype(d.np, copy=False).reshape(shape)
        arr.flags.writeable = False
        out[name] = arr
    return out


def fetched_array(r: httpx.Response, job: str, node: str) -> np.ndarray:
    """The read-only array of a ``GET /v1/jobs/{job}/tensors/{node}`` answer (raw
    little-endian C-order bytes, ``X-Triplane-Shape`` / ``X-Triplane-Dtype``)."""
    from triplane.sdk.remote import RemoteError

    shape_h = r.headers.get("X-Triplane-Shape", "")
    try:
        shape = tuple(int(s) for s in shape_h.split(",") if s.strip())
        d = dt.dtype(r.headers.get("X-Triplane-Dtype", ""))
    except (ValueError, TriplaneError):
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
