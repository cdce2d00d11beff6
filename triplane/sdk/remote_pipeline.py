"""Pipelined compiled steps: an optimiser step that keeps its values on the cluster is
submitted without waiting for its job, so the Python of the next step runs while the
cluster computes this one (docs/runtime.md "Pipelined steps").

One step is in flight at a time. Its outputs are :class:`RemoteValue` s at once: those
it keeps (parameters, optimiser state) as for any step, the others (its loss: *deferred*
outputs) until the next step's answer brings their values. The next step's submit binds
the kept ones by ref with ``await_refs_s`` -- the scheduler waits for the step in flight
to end before it binds them -- and names the deferred ones in ``inline_refs``; its answer
carries their values (``ref_values``), and each deferred Tensor gets its host array: a
loop that keeps every step's loss (``losses.append(loss)``) holds arrays, never jobs, so
every step's job is released as it would be without pipelining.

Settling. Anything that needs the step in flight done first settles it: reading one of
its values (``.item()``, ``.numpy()``, ``state_dict()``), a checkpoint, any other job of
the session (another structure, a full graph), a step not bound to it. Settling waits for
its job (its error if it failed) and fetches its deferred values. A loop that reads a
deferred value of every step before the next one (``loss.item()`` each step) gains
nothing from pipelining: after :data:`READS_TO_SYNC` such steps its structure runs
synchronously, its small outputs inline in the answer, for :data:`SYNC_STEPS` steps;
then it is pipelined again (and back to synchronous if the reads go on).

Failures. A step whose submit finds the step in flight failed gets that step's error. A
step answered ``lost`` (an executor holding its inputs is gone) recovers as every step
does (``Resident.restore``: back to the checkpoint), with one addition: if the deferred
values of the step in flight cannot be had (its job failed too, or they went with the
executor), that step runs once more from the restored values before the step that found
the loss, so its loss is read as it would have been without pipelining.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from triplane.proto.errors import TriplaneError
from triplane.proto.ir import TensorType
from triplane.sdk.remote_values import RemoteValue

if TYPE_CHECKING:
    from triplane.sdk.remote import RemoteSession
    from triplane.sdk.remote_steps import BoundStep
    from triplane.sdk.tensor import Tensor

__all__ = ["AWAIT_REFS_S", "READS_TO_SYNC", "SYNC_STEPS", "InFlight", "Pipeline"]

log = logging.getLogger("triplane.sdk.remote")

AWAIT_REFS_S = 30.0  # a step waits this long for the step before (then 409 not_ready: settle, again)
READS_TO_SYNC = 2  # steps in a row whose deferred outputs were read before the next: synchronous
SYNC_STEPS = 200  # ... for this many steps of that structure, then pipelined again


@dataclass
class InFlight:
    """The pipelined step in flight."""

    job: str
    key: Any  # its structure (the trace cache's key)
    step: BoundStep
    inputs: list[Tensor]  # the walk's inputs (a step run again binds their values again)
    kept: dict[str, TensorType]  # fetched names it keeps on the cluster -> their types
    # ref of a deferred output -> (its Tensor, weakly; the RemoteValue it holds until delivered)
    deferred: dict[str, tuple[weakref.ref[Tensor], RemoteValue | None]] = field(default_factory=dict)


class Pipeline:
    """A remote session's pipelined steps (the module doc)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.pipelined = 0  # steps submitted without waiting for their job
        self.redone = 0  # steps in flight run again after a loss
        self.inflight: InFlight | None = None
        # structures run synchronously (their loop reads every step) -> such steps left
        self._sync: dict[Any, int] = {}
        self._reads: dict[Any, int] = {}  # structure -> steps in a row read before the next
        self._read_of: str | None = None  # the job whose deferred output was read while in flight
        self._last: str | None = None  # the last pipelined step's job
        self._lock = threading.RLock()  # threads sharing the session: one at a time in here

    def wants(self, key: Any, keep: frozenset[int]) -> bool:
        """Whether a compiled step of structure ``key`` keeping ``keep`` is pipelined (once
        per step: a structure run synchronously is tried again after :data:`SYNC_STEPS`)."""
        if not self.enabled or not keep:
            return False
        left = self._sync.get(key)
        if left is None:
            return True
        if left <= 1:
            del self._sync[key]  # the loop may read less now: pipelined again (two reads: back)
        else:
            self._sync[key] = left - 1
        return False

    def submit(self, session: RemoteSession, key: Any, step: BoundStep, inputs: list[Tensor],
               outputs: Sequence[Tensor], keep: frozenset[int], args: list[Any]) -> dict[str, Any] | None:
        """Submit without waiting; every fetched output a RemoteValue (name -> value). None
        when the scheduler no longer knows the plan (the step before is settled first)."""
        with self._lock:
            return self._submit(session, key, step, inputs, outputs, keep, args)

    def _submit(self, session: RemoteSession, key: Any, step: BoundStep, inputs: list[Tensor],
                outputs: Sequence[Tensor], keep: frozenset[int], args: list[Any]) -> dict[str, Any] | None:
        from triplane.sdk.remote import RemoteError

        before = self.inflight
        if before is not None and not any(type(a) is str and a.startswith(f"{before.job}:") for a in args):
            self._settle(session, None)  # not bound to the step in flight
            before = None
        request: dict[str, Any] = {"plan": step.plan, "args": args, "fetch": list(step.fetch),
                                   "await_refs_s": AWAIT_REFS_S}
        if before is not None and before.deferred:
            request["inline_refs"] = list(before.deferred)
        try:
            try:
                answer = session.submit_job(request, None, hold=True)
            except RemoteError as e:
                if e.status != 409 or e.kind != "not_ready" or before is None:
                    raise
                self._settle(session, None)  # the step before runs longer than AWAIT_REFS_S: wait, once more
                request.pop("inline_refs", None)
                before = None
                answer = session.submit_job(request, None, hold=True)
        except RemoteError as e:
            if e.kind == "lost":
                raise  # (evaluate recovers: ``recover`` settles or runs again the step in flight)
            if before is not None:
                self._settle(session, None)  # its own error, if that is why (a failed step's refs are 404)
            if e.status == 409 and "unknown plan" in str(e):
                return None
            raise
        except KeyboardInterrupt:
            if before is not None:
                session.interrupted(before.job)  # the step before: cancelled too
            self.inflight = None
            raise
        job = str(answer["id"])
        if before is not None:
            self.inflight = None
            try:
                self._deliver(session, before, answer.get("ref_values"))
            except TriplaneError as e:  # (this step is submitted: those values stay remote, read later)
                log.debug("values of %s not delivered: %s", before.job, e)
        if self._read_of is None or self._read_of != self._last:
            self._reads[key] = 0  # the step before was not read before this one
        self._read_of, self._last = None, job
        kept = {v: outputs[i]._type for i, (fetched, v) in enumerate(step.outputs) if fetched and i in keep}
        every = {v: outputs[i]._type for i, (fetched, v) in enumerate(step.outputs) if fetched}
        got = session.finish(answer, step.fetch, every, wait=False)
        inf = InFlight(job, key, step, list(inputs), kept)
        for i, (fetched, v) in enumerate(step.outputs):
            if fetched and v not in kept:
                inf.deferred[f"{job}:{v}"] = (weakref.ref(outputs[i]), got[v])
        self.inflight = inf
        self.pipelined += 1
        return got

    def settle(self, session: RemoteSession, read: RemoteValue | None = None) -> None:
        """Wait for the step in flight (its error if it failed) and fetch its deferred
        values. With ``read`` (a value about to be fetched): only if it is of that step."""
        if self.inflight is None:
            return
        with self._lock:
            self._settle(session, read)

    def _settle(self, session: RemoteSession, read: RemoteValue | None) -> None:
        inf = self.inflight
        if inf is None:
            return
        if read is not None:
            if read.job_id != inf.job:
                return
            if read.ref in inf.deferred:  # a deferred output read before the next step
                self._read_of = inf.job
                self._reads[inf.key] = n = self._reads.get(inf.key, 0) + 1
                if n >= READS_TO_SYNC:
                    self._sync[inf.key] = SYNC_STEPS
                    self._reads[inf.key] = 0
        self.inflight = None
        session.wait(inf.job)
        self._deliver(session, inf, None)

    def recover(self, session: RemoteSession, error: Exception, in_step: bool) -> None:
        """A step failed with ``lost``: deliver the step in flight's deferred values if they
        can be had, go back to the checkpoint (``Resident.restore``), and run the step in
        flight again from there if they could not."""
        with self._lock:
            self._recover(session, error, in_step)

    def _recover(self, session: RemoteSession, error: Exception, in_step: bool) -> None:
        inf, self.inflight = self.inflight, None
        if inf is not None:
            try:
                session.wait(inf.job)
                self._deliver(session, inf, None)
                inf = None  # done and delivered: its kept values are restored as any
            except TriplaneError:
                pass  # failed, or its values went with the executor: run again below
        # The Tensors holding its values, by name (the restore rebinds those it knows).
        held = [] if inf is None else [(weakref.ref(t), v.ref.partition(":")[2])
                                       for t, v in session.holders.live(session) if v.job_id == inf.job]
        session.resident.restore(error, in_step=in_step, redo=None if inf is None else inf.job)
        if inf is not None:
            self._redo(session, inf, held)

    def _redo(self, session: RemoteSession, inf: InFlight,
              held: list[tuple[weakref.ref[Tensor], str]]) -> None:
        """Run ``inf``'s step once more, synchronously, binding its inputs' values now."""
        from triplane.sdk.remote_steps import bind_arg

        step = inf.step
        args = [bind_arg(session, inf.inputs[p]._value) for p in step.args]
        request = {"plan": step.plan, "args": args, "fetch": list(step.fetch)}
        inline = [n for n in step.fetch if n not in inf.kept]
        got = session.finish(session.submit_job(request, inline), step.fetch, inf.kept)
        for wt, name in held:
            t = wt()
            if t is not None and name in got:
                t._value = got[name]
        self.redone += 1

    @staticmethod
    def _deliver(session: RemoteSession, inf: InFlight, ref_values: Any) -> None:
        """Each deferred Tensor of ``inf`` gets its host array: from ``ref_values`` (the
        next step's answer), else fetched."""
        from triplane.sdk.remote_steps import decode_values

        values = decode_values(ref_values) if ref_values else {}
        for ref, (wt, v) in list(inf.deferred.items()):
            if v is None:
                continue  # (delivered before)
            arr = values.get(ref)
            if arr is None:
                job, _, name = ref.partition(":")
                arr = session.fetch(job, name)
            v.host = arr
            t = wt()
            if t is not None and t._value is v:
                t._value = arr
            inf.deferred[ref] = (wt, None)
