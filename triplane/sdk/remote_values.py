"""Values that stay on the cluster: resident parameters and optimiser state.

A :class:`RemoteValue` stands in a Tensor's value slot instead of a host array: a kept
output of a done job on the cluster (its ref ``"<job>:<node>"``, docs/runtime.md "Refs"),
or, after an executor loss, the upload id of its checkpoint copy. A later graph reads it
as an input bound to that string, so a training loop never sends parameters back and
forth; :meth:`RemoteValue.numpy` fetches it once and caches the host copy.

Lifecycle. Every value of one job shares a :class:`RemoteJob`; when the last of them dies
(no Tensor holds one any more) its finalizer queues ``DELETE /v1/jobs/{id}`` on the
session's keeper (no I/O in the finalizer). :class:`Holders` is the session's weak set of
the Tensors holding its values, for checkpoints and for downloading at ``tp.disconnect()``.

Checkpoints (:class:`Checkpoint`). Every ``checkpoint_every`` optimiser steps (kept
evaluations) the session copies every live remote value into the scheduler's upload store
with ONE ``POST /v1/tensors/copy`` and releases the previous checkpoint's copies. When a
step fails because an executor holding its inputs is gone (``lost``), the session rebinds
every Tensor the checkpoint knows to its copy -- all of them, so parameters and optimiser
state stay consistent -- logs one warning naming the steps lost, and runs the step again.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from triplane.proto.ir import TensorType

if TYPE_CHECKING:
    from triplane.sdk.remote import RemoteSession
    from triplane.sdk.tensor import Tensor

__all__ = ["Checkpoint", "Holders", "RemoteJob", "RemoteValue", "Resident", "read_copy"]


class RemoteJob:
    """A kept job of ``session``: released once no :class:`RemoteValue` of it is alive."""

    __slots__ = ("__weakref__", "id")

    def __init__(self, session: RemoteSession, job: str) -> None:
        self.id = job
        if session.release_values:
            weakref.finalize(self, session.job_unused, job)


class RemoteValue:
    """A tensor value held on the cluster of ``session``.

    ``ref`` is what a graph binds: ``"<job>:<node>"`` (``job`` holds the job alive) or the
    upload id of a checkpoint copy (``job`` is None). ``host`` caches the fetched copy
    (values that came back inline with their job have it from the start)."""

    __slots__ = ("host", "job", "ref", "session", "type")

    def __init__(self, session: RemoteSession, ref: str, type_: TensorType, job: RemoteJob | None = None,
                 host: np.ndarray | None = None) -> None:
        self.session, self.ref, self.type, self.job, self.host = session, ref, type_, job, host

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.type.dtype.np

    @property
    def job_id(self) -> str | None:
        return self.job.id if self.job is not None else None

    def numpy(self) -> np.ndarray:
        """The value on this host (fetched once, then cached; read-only)."""
        if self.host is None:
            self.host = self.session.fetch_value(self)
        return self.host

    def __repr__(self) -> str:
        return f"RemoteValue({self.ref!r}, {self.type.dtype.name}{list(self.type.shape)})"


def read_copy(session: RemoteSession, value: RemoteValue) -> np.ndarray:
    """The host copy of ``value``, an upload of ``session`` (a checkpoint copy): read
    through a one-node job."""
    from triplane.proto.ir import Attrs
    from triplane.sdk.tensor import Tensor, apply

    src = Tensor("input", (), Attrs(), value.type, value=value)
    n = value.type.size
    flat = apply("reshape", [src], shape=(n,) if len(value.shape) != 1 else (n, 1))
    (arr,) = session.evaluate([flat])
    out = np.asarray(arr).reshape(value.shape)
    out.flags.writeable = False
    return out


class Holders:
    """The Tensors holding a session's remote values, weakly (a Tensor that dies leaves).
    Keyed by identity: a Tensor's ``==`` builds a graph, so no WeakSet."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Tensor]] = {}

    def add(self, t: Tensor) -> None:
        key = id(t)
        if key in self._refs:
            return

        def gone(_: object, key: int = key) -> None:
            self._refs.pop(key, None)

        self._refs[key] = weakref.ref(t, gone)

    def live(self, session: RemoteSession) -> Iterator[tuple[Tensor, RemoteValue]]:
        """Each live Tensor whose slot still holds a value of ``session``, with that value."""
        for ref in list(self._refs.values()):
            t = ref()
            v = t._value if t is not None else None
            if isinstance(v, RemoteValue) and v.session is session:
                yield t, v  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._refs)


@dataclass
class Checkpoint:
    """Copies of a session's live remote values after optimiser step ``step``:
    Tensor (weakly) -> upload id of its copy."""

    step: int
    # (Tensor, the upload id of its copy -- or the host array, downloaded -- its type)
    entries: list[tuple[weakref.ref[Tensor], str | np.ndarray, TensorType]] = field(default_factory=list)

    def uploads(self) -> set[str]:
        return {uid for _, uid, _ in self.entries if isinstance(uid, str)}


class Resident:
    """A session's checkpoints of its kept values and the restore after an executor loss.

    ``every`` optimiser steps (evaluations that keep values; 0: never) :meth:`before_step`
    copies every live value to the scheduler's disk in one request (the cost: one copy of
    the parameters and optimiser state from the executors to the scheduler's disk per
    ``every`` steps, and that much disk) and releases the previous copies."""

    def __init__(self, session: RemoteSession, every: int) -> None:
        if every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {every}")
        self.session = session
        self.every = every
        self.steps = 0  # evaluations that kept values
        self.last: Checkpoint | None = None
        self.restores = 0
        self.copies = True  # the scheduler copies values (else checkpoints are downloaded)

    def before_step(self) -> None:
        from triplane.sdk.remote import RemoteError

        self.steps += 1
        if self.every and self.steps > 1 and (self.steps - 1) % self.every == 0:
            try:
                self.checkpoint()
            except RemoteError as e:  # training goes on; a loss before the next one fails
                logging.getLogger("triplane.sdk.remote").warning(
                    "checkpoint after step %d failed (%s); the last one stays", self.steps - 1, e)

    def checkpoint(self) -> Checkpoint:
        """Copy every live remote value (one ``POST /v1/tensors/copy``); values already
        restored from a copy keep it. The previous checkpoint's other copies are released.
        A scheduler without the copy request (404/405) gets the values downloaded instead
        (one request each, held in this process)."""
        from triplane.sdk.remote import RemoteError

        s = self.session
        s.steps.pipe.settle(s)  # the values of a pipelined step in flight are copied once it ended
        live = list(s.holders.live(s))
        refs = list(dict.fromkeys(v.ref for _, v in live if v.job is not None))
        copies: dict[str, Any] = {}
        if refs and self.copies:
            try:
                copies = dict(zip(refs, s.copy_values(refs), strict=True))
            except RemoteError as e:
                if e.status not in (404, 405):
                    raise
                self.copies = False
                logging.getLogger("triplane.sdk.remote").warning(
                    "the scheduler cannot copy values (%s): checkpoints are downloaded instead", e)
        ck = Checkpoint(self.steps - 1)
        for t, v in live:
            if v.job is None:
                ck.entries.append((weakref.ref(t), v.ref, v.type))
            else:
                ck.entries.append((weakref.ref(t), copies[v.ref] if v.ref in copies else v.numpy(), v.type))
        old, self.last = self.last, ck
        if old is not None and s.release_values:
            for uid in old.uploads() - ck.uploads():
                s.keeper.queue("tensors", uid)
        return ck

    def restore(self, error: Exception, in_step: bool = True, redo: str | None = None) -> None:
        """After a step failed with ``lost``: rebind every Tensor of the last checkpoint to
        its copy and warn once; RemoteError saying so when there is no checkpoint, or when
        a value of the lost job is not in it (but for ``redo``: a pipelined step in flight,
        run again from here, ``remote_pipeline.Pipeline.recover``)."""
        from triplane.sdk.remote import RemoteError

        s = self.session
        ref = getattr(error, "ref", None)
        lost_job = ref.split(":", 1)[0] if ref else None
        ck = self.last
        if ck is None:
            raise RemoteError(f"an executor holding values of this session is gone ({error}) and there "
                              f"is no checkpoint to go on from yet (the first is taken after "
                              f"{self.every} optimiser steps; checkpoint_every={self.every})"
                              if self.every else
                              f"an executor holding values of this session is gone ({error}); "
                              "checkpoints are off (checkpoint_every=0)", kind="lost", ref=ref) from None
        restored = 0
        for wt, uid, ty in ck.entries:
            t = wt()
            if t is not None:
                t._value = RemoteValue(s, uid, ty) if isinstance(uid, str) else uid
                restored += 1
        for _, v in s.holders.live(s):
            if lost_job is not None and v.job_id == lost_job and lost_job != redo:
                raise RemoteError(f"{v} was lost with its executor and is not in the checkpoint of "
                                  f"step {ck.step} ({error})", kind="lost", ref=ref) from None
        self.restores += 1
        logging.getLogger("triplane.sdk.remote").warning(
            "an executor holding this session's values is gone (%s): went back to the checkpoint of "
            "step %d, %d step(s) lost; %d values restored", error, ck.step,
            self.steps - in_step - (redo is not None) - ck.step, restored)
