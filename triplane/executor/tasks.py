"""Running one admitted task: gather inputs, infer the output type, run the kernel, store it.

``TaskRunner.run(task, received)`` always returns a ``Reply`` and never raises (short of
cancellation): the process must never die from one task. Error kinds follow
``proto/packet.md`` -- what the scheduler does next:

* ``user`` (fail the job, no retry): the kernel raised ``KernelError`` on its data; the op
  is not in the op table; the attributes or input types do not fit the op (the executor
  re-infers the output type itself and never trusts the sender's); a task with other than
  one output. These would fail the same way on every node.
* ``infra`` (drift to another node): an input is neither held here nor pullable (peer down,
  tile lost), memory full, this node's engine does not support the op/dtypes, the engine
  raised anything other than a user ``KernelError``.

Pulled inputs are used for this task only and not kept: the scheduler tracks where tiles
live and releases them, so a private copy here would leak capacity.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from triplane.engines.memory.host import MemoryFullError
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import GraphError, KernelError
from triplane.proto.ir import TensorType
from triplane.proto.packet import Reply, TaskError, TaskPacket, TileInfo, Timings

__all__ = ["INLINE_BYTES", "MAX_MESSAGE_CHARS", "Puller", "TaskRunner"]

Puller = Callable[[str, str], Awaitable[np.ndarray]]  # (node, tile) -> array

# Kernels touching at most this many bytes run on the event loop: a worker-thread hop costs
# more than they do, and tiny tasks dominate dispatch benchmarks.
INLINE_BYTES = 64 * 1024
# Keeps an error reply (task id, message, signature) inside one 1472-byte datagram.
MAX_MESSAGE_CHARS = 1000


class _Fail(Exception):
    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def _clip(message: str) -> str:
    message = message.encode("utf-8", "replace").decode("utf-8")
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 3] + "..."


class TaskRunner:
    """Runs tasks on ``engine`` (an OpEngine) with tiles in ``store`` (a host memory engine).

    ``pull(node, tile)`` fetches an input from another node (raising anything on failure);
    ``node`` is this executor's own name (inputs "pulled" from it are read locally).
    Kernels run in a pool of ``workers`` threads, except tiny ones (``inline_bytes``).
    """

    def __init__(self, engine: Any, store: Any, pull: Puller, *, node: str, workers: int = 1,
                 inline_bytes: int = INLINE_BYTES) -> None:
        self.engine = engine
        self.store = store
        self.pull = pull
        self.node = node
        self.inline_bytes = inline_bytes
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="kernel")
        self.stats = {"ok": 0, "user_errors": 0, "infra_errors": 0, "pulled_bytes": 0}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, task: TaskPacket, received: float,
                  on_slow: Callable[[str], None] | None = None) -> Reply:
        """Run ``task``; ``on_slow(task_id)`` is called if its kernel goes to a worker thread
        (the shell acks such tasks so the scheduler stops retransmitting them)."""
        start = time.time()
        try:
            info, start, end = await self._run(task, on_slow)
        except _Fail as f:
            self.stats["user_errors" if f.kind == "user" else "infra_errors"] += 1
            return Reply(task.task, False, Timings(received, start, time.time()), (),
                         TaskError(f.kind, _clip(str(f))))  # type: ignore[arg-type]
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or an engine fault: the node is at fault, not the user
            self.stats["infra_errors"] += 1
            return Reply(task.task, False, Timings(received, start, time.time()), (),
                         TaskError("infra", _clip(f"executor fault: {type(e).__name__}: {e}")))
        self.stats["ok"] += 1
        return Reply(task.task, True, Timings(received, start, end), (info,))

    async def _run(self, task: TaskPacket,
                   on_slow: Callable[[str], None] | None) -> tuple[TileInfo, float, float]:
        try:
            op_def = optable.get(task.op)
        except GraphError as e:
            raise _Fail("user", str(e)) from None
        if len(task.outputs) != 1:
            raise _Fail("user", f"{task.op}: a task has exactly one output tile, got {len(task.outputs)}")
        out_tile = task.outputs[0]
        inputs = await self._gather(task)
        try:
            attrs = op_def.normalise_attrs(task.attrs)
            out_t = op_def.check([TensorType(a.shape, dt.dtype(a.dtype)) for a in inputs], attrs)
        except GraphError as e:
            raise _Fail("user", str(e)) from None
        in_dtypes = [dt.dtype(a.dtype).name for a in inputs]
        if not self.engine.supports(task.op, in_dtypes):
            raise _Fail("infra", f"engine {self.engine.name!r} does not support {task.op} on {in_dtypes}")
        try:
            self.store.reserve(out_t.nbytes, out_tile)
        except MemoryFullError as e:
            raise _Fail("infra", str(e)) from None
        try:
            start = time.time()
            result = await self._kernel(task, inputs, attrs, out_t, on_slow)
            end = time.time()
        except KernelError as e:
            self.store.release(out_t.nbytes)
            raise _Fail("infra" if e.kind == "infra" else "user", str(e)) from None
        except BaseException as e:
            self.store.release(out_t.nbytes)
            if isinstance(e, Exception):
                raise _Fail("infra", f"engine {self.engine.name!r} crashed: "
                                     f"{type(e).__name__}: {e}") from None
            raise
        try:
            self.store.put(out_tile, result, reserved=out_t.nbytes)
        except MemoryFullError as e:
            raise _Fail("infra", str(e)) from None
        return TileInfo(out_tile, tuple(result.shape), out_t.dtype.name, int(result.nbytes)), start, end

    async def _kernel(self, task: TaskPacket, inputs: list[np.ndarray], attrs: Any, out_t: TensorType,
                      on_slow: Callable[[str], None] | None) -> np.ndarray:
        touched = out_t.nbytes + sum(a.nbytes for a in inputs)
        if touched <= self.inline_bytes:
            return self.engine.run(task.op, inputs, attrs, out_t)
        if on_slow is not None:
            on_slow(task.task)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self.engine.run, task.op, inputs, attrs, out_t)

    async def _gather(self, task: TaskPacket) -> list[np.ndarray]:
        """Inputs in argument order: local tiles from the store, the others pulled at once
        (each distinct tile once, concurrently)."""
        have: dict[str, np.ndarray] = {}
        to_pull: dict[str, str] = {}
        for tile in dict.fromkeys(task.inputs):
            node = task.pull_from.get(tile)
            if tile in self.store:
                have[tile] = self.store.get(tile)
            elif node is not None and node != self.node:
                to_pull[tile] = node
            else:
                raise _Fail("infra", f"input tile {tile} is not held on node {self.node}"
                            + ("" if node is None else " (the packet says it is here)"))
        if to_pull:
            results = await asyncio.gather(*(self.pull(n, t) for t, n in to_pull.items()),
                                           return_exceptions=True)
            for (tile, node), res in zip(to_pull.items(), results):
                if isinstance(res, BaseException):
                    if isinstance(res, asyncio.CancelledError):
                        raise res
                    raise _Fail("infra", f"pulling input {tile} from node {node} failed: {res}")
                have[tile] = res
                self.stats["pulled_bytes"] += int(res.nbytes)
        return [have[t] for t in task.inputs]
