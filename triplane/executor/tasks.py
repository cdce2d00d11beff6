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

An input whose source in the packet is this node itself is being made here by an earlier
task (the scheduler sent this one early, behind it): the task waits until that task ends,
and fails (``infra``) if it failed, or if no task making it arrives within
``wait_for_input_s`` (a recalled attempt whose input went elsewhere).

A grouped task (op ``graph``: a tiny job's whole plan, ``proto/packet.md``) runs its
prepared program (``executor/group.py``) as one loop and stores every output; a failure
inside it names the program node (the reply error's ``at``) and is of the failing
kernel's kind, so an ``infra`` one drifts the whole group.

Pulled job tiles are used for this task only and not kept: the scheduler tracks where
tiles live and releases them, so a private copy here would leak capacity. Tiles of
uploaded tensors (``u-<32 hex>``, whole or a region ``u-<hex>@lo:hi,...``) are immutable
and nobody releases them: they are kept as *cache entries* of the memory engine
(reclaimable, evicted least recently used first when a tile needs the room), so a later
task here, of this job or another, reads them without a pull. Concurrent tasks needing
the same upload tile share one pull. An entry is in use (not evictable) while a task
reads it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from triplane.engines.errors import MemoryFullError
from triplane.engines.memory.persist import PERSIST_ATTR
from triplane.executor.blas import WideBlas
from triplane.executor.group import GroupError, Prepared, Programs, check_inputs, run_prepared
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import GraphError, KernelError
from triplane.proto.ir import TensorType
from triplane.proto.packet import (
    REPLY_CARRY_MAX_BYTES,
    Carried,
    Reply,
    TaskError,
    TaskPacket,
    TileInfo,
    Timings,
)
from triplane.proto.packet.group import GROUP_OP

__all__ = ["INLINE_BYTES", "MAX_MESSAGE_CHARS", "STALL_ENV", "Puller", "TaskRunner", "is_upload_tile",
           "stall_from_env"]

Puller = Callable[[str, str], Awaitable[np.ndarray]]  # (node, tile) -> array

# Kernels touching at most this many bytes run on the event loop: a worker-thread hop costs
# more than they do, and tiny tasks dominate dispatch benchmarks.
INLINE_BYTES = 64 * 1024
# A grouped task this small (a small model's training step: well under a millisecond of
# kernels) runs on the event loop too: the hop to a worker thread and back cost as much.
GROUP_INLINE_FLOPS = 2e7
GROUP_INLINE_BYTES = 4 << 20
# How long an early task waits for the task making its input here to arrive (it was sent
# first, so normally it is here already; a lost datagram is resent within its deadline).
WAIT_FOR_INPUT_S = 10.0
# Keeps an error reply (task id, message, signature) inside one 1472-byte datagram.
MAX_MESSAGE_CHARS = 1000
_UPLOAD_TILE = re.compile(r"u-[0-9a-f]{32}(@[0-9:,]*)?")
# Fault injection for chaos tests: "<op>:<seconds>" makes the first kernel of <op> that a
# first attempt (".a0") runs in a worker thread here hang that long -- a hung kernel on a
# live executor, which keeps acknowledging (docs/executor.md).
STALL_ENV = "TRIPLANE_FAULT_STALL_KERNEL"


def stall_from_env(env: dict[str, str] | None = None) -> tuple[str, float] | None:
    """(op, seconds) from ``$TRIPLANE_FAULT_STALL_KERNEL``, or None; ValueError if malformed."""
    text = (os.environ if env is None else env).get(STALL_ENV, "")
    if not text:
        return None
    op, sep, seconds = text.rpartition(":")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if not sep or not op or not value >= 0.0:
        raise ValueError(f"{STALL_ENV} must be '<op>:<seconds>', got {text!r}")
    return op, value


class _Fail(Exception):
    """A task failure of ``kind``; ``node``/``input``: the node an input was to be pulled
    from and that input tile, when pulling it failed (the reply's structured error)."""

    def __init__(self, kind: str, message: str, *, node: str | None = None,
                 input: str | None = None, at: str | None = None) -> None:
        self.kind, self.node, self.input, self.at = kind, node, input, at
        super().__init__(message)


def is_upload_tile(tile: str) -> bool:
    """An uploaded tensor's tile (``u-<32 hex>`` or a region of one): immutable, cacheable."""
    return _UPLOAD_TILE.fullmatch(tile) is not None


def _clip(message: str) -> str:
    message = message.encode("utf-8", "replace").decode("utf-8")
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 3] + "..."


def _timed(engine: Any, op: str, inputs: list[np.ndarray], attrs: Any,
           out_t: TensorType) -> tuple[float, np.ndarray, float]:
    start = time.time()
    result = engine.run(op, inputs, attrs, out_t)
    return start, result, time.time()


def _timed_group(engine: Any, prep: Prepared,
                 inputs: list[np.ndarray]) -> tuple[float, list[np.ndarray], float]:
    start = time.time()
    results = run_prepared(prep, inputs, engine)
    return start, results, time.time()


class TaskRunner:
    """Runs tasks on ``engine`` (an OpEngine) with tiles in ``store`` (a host memory engine).

    ``pull(node, tile)`` fetches an input from another node (raising anything on failure);
    ``node`` is this executor's own name (inputs "pulled" from it are read locally).
    Kernels run in a pool of ``workers`` threads, except tiny ones (``inline_bytes``) and
    those the engine says return a view of their input (``engine.cheap(op, inputs)``).
    """

    def __init__(self, engine: Any, store: Any, pull: Puller, *, node: str, workers: int = 1,
                 inline_bytes: int = INLINE_BYTES, wait_for_input_s: float = WAIT_FOR_INPUT_S,
                 stall: tuple[str, float] | None = None) -> None:
        self.engine = engine
        self.wait_for_input_s = wait_for_input_s
        self.store = store
        self.pull = pull
        self.node = node
        self.inline_bytes = inline_bytes
        self._cheap = getattr(engine, "cheap", None)  # optional: which kernels return views
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="kernel")
        self.blas = WideBlas()  # a big grouped task (a job kept whole) runs with every core
        self.stats = {"ok": 0, "user_errors": 0, "infra_errors": 0, "pulled_bytes": 0,
                      "peer_bytes": 0, "upload_pulls": 0, "upload_hits": 0, "carried_bytes": 0}
        self._pulling: dict[str, asyncio.Task[np.ndarray]] = {}  # upload tile -> its pull
        self._making: dict[str, int] = {}  # output tile -> attempts running here making it
        self._made: dict[str, asyncio.Future[bool]] = {}  # tile -> made (True) or failed
        self._started: dict[str, float] = {}  # task id -> its kernel's start, while it runs
        self._stall = stall if stall is not None else stall_from_env()  # fault injection
        self._unstall = threading.Event()  # set by close(): a stalled kernel returns at once
        self.programs = Programs()  # grouped tasks' prepared sub-graphs, by program text
        self.persist: dict[str, Any] = {}  # kind -> persistence target (engines/memory/persist.py)

    def running_since(self, task_id: str) -> float | None:
        """When ``task_id``'s kernel started, while it runs in a worker thread (None before
        and after): the progress an ack reports, so the scheduler can tell a long kernel
        from one hung past its deadline."""
        return self._started.get(task_id)

    def close(self) -> None:
        self._unstall.set()
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, task: TaskPacket, received: float,
                  on_slow: Callable[[str], None] | None = None) -> Reply:
        """Run ``task``; ``on_slow(task_id)`` is called if its kernel goes to a worker thread
        (the shell acks such tasks so the scheduler stops retransmitting them)."""
        start = time.time()
        out = task.outputs[0] if len(task.outputs) == 1 else None
        if out is not None:
            self._making[out] = self._making.get(out, 0) + 1
        made = False
        persist = task.attrs.get(PERSIST_ATTR) if task.attrs else None
        if persist is not None:  # the job's tiles are kept by a persistence target too
            task = task._replace(attrs={k: v for k, v in task.attrs.items() if k != PERSIST_ATTR})
        carried: dict[str, Carried] = {}
        try:
            if task.op == GROUP_OP:
                infos, start, end = await self._run_group(task, on_slow)
                carried = self._carried(infos)
            else:
                info, start, end = await self._run(task, on_slow)
                infos = (info,)
            if persist is not None:
                await self._persist(persist, infos)
            made = True
        except _Fail as f:
            self.stats["user_errors" if f.kind == "user" else "infra_errors"] += 1
            return Reply(task.task, False, Timings(received, start, time.time()), (),
                         TaskError(f.kind, _clip(str(f)), f.node or self.node, f.input, f.at))  # type: ignore[arg-type]
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or an engine fault: the node is at fault, not the user
            self.stats["infra_errors"] += 1
            return Reply(task.task, False, Timings(received, start, time.time()), (),
                         TaskError("infra", _clip(f"executor fault: {type(e).__name__}: {e}"), self.node))
        finally:
            self._started.pop(task.task, None)
            if out is not None:
                left = self._making.pop(out) - 1
                if left:  # another attempt still makes it (a recalled one, say)
                    self._making[out] = left
                if made or not left:
                    waiting = self._made.pop(out, None)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(made)
        self.stats["ok"] += 1
        return Reply(task.task, True, Timings(received, start, end), infos, None, carried)

    def _carried(self, infos: tuple[TileInfo, ...]) -> dict[str, Carried]:
        """A grouped task's smallest outputs (a step's loss first), up to
        ``REPLY_CARRY_MAX_BYTES`` in all, for its reply to carry: the scheduler answers a
        fetch of them without reading them back (proto/packet.md, "Carried values")."""
        out: dict[str, Carried] = {}
        room = REPLY_CARRY_MAX_BYTES
        for info in sorted(infos, key=lambda i: i.bytes):
            if info.bytes > room:
                break
            arr = self.store.get(info.tile)
            if type(arr) is np.ndarray:  # (a device engine's array stays where it is)
                out[info.tile] = Carried(info.shape, info.dtype, np.ascontiguousarray(arr).tobytes())
                room -= info.bytes
        return out

    async def _persist(self, kind: Any, infos: tuple[TileInfo, ...]) -> None:
        """Write the tiles just made to the persistence target of ``kind`` (before the reply,
        so a task reported done has its output kept there)."""
        target = self.persist.get(kind) if isinstance(kind, str) else None
        if target is None:
            raise _Fail("infra", f"the job asks for its tiles to persist to {kind!r}, but this executor "
                                 f"has no such target (its --persist-to: {sorted(self.persist) or 'none'})")
        for info in infos:
            arr = self.store.get(info.tile)
            await asyncio.to_thread(target.put, info.tile, arr)
            self.stats["persisted"] = self.stats.get("persisted", 0) + 1
            self.stats["persisted_bytes"] = self.stats.get("persisted_bytes", 0) + int(arr.nbytes)

    async def _run(self, task: TaskPacket,
                   on_slow: Callable[[str], None] | None) -> tuple[TileInfo, float, float]:
        try:
            op_def = optable.get(task.op)
        except GraphError as e:
            raise _Fail("user", str(e)) from None
        if len(task.outputs) != 1:
            raise _Fail("user", f"{task.op}: a task has exactly one output tile, got {len(task.outputs)}")
        inputs, in_use = await self._gather(task, on_slow)
        try:
            return await self._compute(task, op_def, inputs, in_use, on_slow)
        finally:
            for key in in_use:
                self.store.cache_done(key)

    async def _compute(self, task: TaskPacket, op_def: Any, inputs: list[np.ndarray], in_use: list[str],
                       on_slow: Callable[[str], None] | None) -> tuple[TileInfo, float, float]:
        out_tile = task.outputs[0]
        try:
            attrs = op_def.normalise_attrs(task.attrs)
            out_t = op_def.check([TensorType(a.shape, dt.dtype(a.dtype)) for a in inputs], attrs)
        except GraphError as e:
            raise _Fail("user", str(e)) from None
        in_dtypes = [dt.dtype(a.dtype).name for a in inputs]
        nbytes = out_t.nbytes  # a computed property: once per task
        if not self.engine.supports(task.op, in_dtypes):
            raise _Fail("infra", f"engine {self.engine.name!r} does not support {task.op} on {in_dtypes}")
        try:
            self.store.reserve(nbytes, out_tile)
        except MemoryFullError as e:
            if not in_use:
                raise _Fail("infra", str(e)) from None
            # Our own inputs, kept as cache entries, take the room: give them up (this task
            # holds their arrays still) rather than fail where an uncached run would not.
            for key in in_use:
                self.store.cache_drop(key)
            in_use.clear()
            try:
                self.store.reserve(nbytes, out_tile)
            except MemoryFullError as e2:
                raise _Fail("infra", str(e2)) from None
        try:
            start, result, end = await self._kernel(task, inputs, attrs, out_t, nbytes, on_slow)
        except KernelError as e:
            self.store.release(nbytes)
            raise _Fail("infra" if e.kind == "infra" else "user", str(e)) from None
        except BaseException as e:
            self.store.release(nbytes)
            if isinstance(e, Exception):
                raise _Fail("infra", f"engine {self.engine.name!r} crashed: "
                                     f"{type(e).__name__}: {e}") from None
            raise
        try:
            self.store.put(out_tile, result, reserved=nbytes)
        except MemoryFullError as e:
            raise _Fail("infra", str(e)) from None
        return TileInfo(out_tile, tuple(result.shape), out_t.dtype.name, int(result.nbytes)), start, end

    async def _run_group(self, task: TaskPacket, on_slow: Callable[[str], None] | None
                         ) -> tuple[tuple[TileInfo, ...], float, float]:
        """A grouped task (op ``graph``): its prepared sub-graph run as one loop, every
        output stored. Failures name the sub-graph node (``_Fail.at``)."""
        try:
            prep = self.programs.get(task.attrs.get("program"), len(task.inputs), len(task.outputs),
                                     self.engine)
        except GroupError as e:
            raise _Fail(e.kind, str(e), at=e.at) from None
        inputs, in_use = await self._gather(task, on_slow)
        reserved: list[tuple[str, int]] = []
        try:
            try:
                check_inputs(prep, inputs)
            except GroupError as e:
                raise _Fail(e.kind, str(e)) from None
            for tile, t in zip(task.outputs, prep.out_types):
                nbytes = t.nbytes
                try:
                    self.store.reserve(nbytes, tile)
                except MemoryFullError as e:
                    for key in in_use:  # our cached inputs take the room: give them up (see _compute)
                        self.store.cache_drop(key)
                    in_use.clear()
                    try:
                        self.store.reserve(nbytes, tile)
                    except MemoryFullError:
                        raise _Fail("infra", str(e)) from None
                reserved.append((tile, nbytes))
            small = prep.flops <= GROUP_INLINE_FLOPS and prep.touched <= GROUP_INLINE_BYTES
            if prep.touched <= self.inline_bytes or (small and not self._stalls(prep)):
                start, results, end = _timed_group(self.engine, prep, inputs)
            else:
                if on_slow is not None:
                    on_slow(task.task)
                loop = asyncio.get_running_loop()
                start, results, end = await loop.run_in_executor(self.pool, self._group_here, task.task, prep,
                                                                 inputs)
            infos = []
            while reserved:
                tile, nbytes = reserved.pop(0)
                arr = results[len(infos)]
                try:
                    self.store.put(tile, arr, reserved=nbytes)
                except MemoryFullError as e:
                    raise _Fail("infra", str(e)) from None
                infos.append(TileInfo(tile, arr.shape, dt.name_of(arr.dtype), arr.nbytes))
            return tuple(infos), start, end
        except GroupError as e:
            raise _Fail(e.kind, str(e), at=e.at) from None
        finally:
            for _, nbytes in reserved:
                self.store.release(nbytes)
            for key in in_use:
                self.store.cache_done(key)

    def _stalls(self, prep: Prepared) -> bool:
        """Would the stall injection hang this program (it runs in a worker thread then)?"""
        stall = self._stall
        return stall is not None and (stall[0] == GROUP_OP or stall[0] in prep.ops)

    def _group_here(self, task_id: str, prep: Prepared, inputs: list[np.ndarray]
                    ) -> tuple[float, list[np.ndarray], float]:
        """``_timed_group`` in a worker thread (its start recorded, the stall injection of an
        op inside it honoured, as ``_timed_here``)."""
        self._started[task_id] = time.time()
        stall = self._stall
        if stall is not None and (stall[0] == GROUP_OP or stall[0] in prep.ops) and task_id.endswith(".a0"):
            self._stall = None  # once
            self._unstall.wait(stall[1])
        with self.blas.wide(prep.flops):
            return _timed_group(self.engine, prep, inputs)

    async def _kernel(self, task: TaskPacket, inputs: list[np.ndarray], attrs: Any, out_t: TensorType,
                      out_bytes: int,
                      on_slow: Callable[[str], None] | None) -> tuple[float, np.ndarray, float]:
        """(start, result, end): the kernel's own times, taken where it runs -- a task queued
        behind another one's kernel in the pool has not started (the plan's actual times
        compare kernel time with predicted compute time)."""
        touched = out_bytes + sum(a.nbytes for a in inputs)
        cheap = self._cheap
        if touched <= self.inline_bytes or (cheap is not None and cheap(task.op, inputs)):
            return _timed(self.engine, task.op, inputs, attrs, out_t)
        if on_slow is not None:
            on_slow(task.task)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self._timed_here, task.task, task.op, inputs,
                                          attrs, out_t)

    def _timed_here(self, task_id: str, op: str, inputs: list[np.ndarray], attrs: Any,
                    out_t: TensorType) -> tuple[float, np.ndarray, float]:
        """``_timed`` in a worker thread, its start recorded for ``running_since`` (a dict
        store is atomic under the GIL; ``run`` drops the entry when the task ends)."""
        self._started[task_id] = time.time()
        stall = self._stall
        if stall is not None and stall[0] == op and task_id.endswith(".a0"):
            self._stall = None  # once
            self._unstall.wait(stall[1])
        return _timed(self.engine, op, inputs, attrs, out_t)

    async def _gather(self, task: TaskPacket, on_slow: Callable[[str], None] | None = None
                      ) -> tuple[list[np.ndarray], list[str]]:
        """(inputs in argument order, cache entries now in use): local tiles from the store,
        upload tiles from the cache, the others pulled at once (each distinct tile once,
        concurrently). On failure nothing stays in use."""
        have: dict[str, np.ndarray] = {}
        in_use: list[str] = []
        fetch: dict[str, str] = {}  # tile -> node to pull it from
        for tile, node in task.pull_from.items():
            if node == self.node and tile not in self.store and tile in task.inputs:
                if on_slow is not None:
                    on_slow(task.task)  # delivered: stop resending it while it waits
                if not await self._wait_made(tile):
                    raise _Fail("infra", f"input tile {tile} was to be made on node {self.node}, "
                                         "and its task failed here or did not come")
        try:
            for tile in dict.fromkeys(task.inputs):
                c = task.data.get(tile)
                if c is not None:  # its value came in the packet (read-only: kernels never write inputs)
                    have[tile] = np.frombuffer(c.data, dtype=dt.BY_NAME[c.dtype].np).reshape(c.shape)
                    self.stats["carried_bytes"] += len(c.data)
                    continue
                node = task.pull_from.get(tile)
                cached = self.store.cache_take(tile) if is_upload_tile(tile) else None
                if cached is not None:
                    in_use.append(tile)
                    have[tile] = cached
                    self.stats["upload_hits"] += 1
                elif tile in self.store:
                    have[tile] = self.store.get(tile)
                elif node is not None and node != self.node:
                    fetch[tile] = node
                else:
                    # named (input, this node): the scheduler recomputes it from lineage
                    raise _Fail("infra", f"input tile {tile} is not held on node {self.node}"
                                + ("" if node is None else " (the packet says it is here)"),
                                node=self.node, input=tile)
            if fetch:
                results = await asyncio.gather(*(self._fetch(n, t) for t, n in fetch.items()),
                                               return_exceptions=True)
                failed: tuple[str, str, BaseException] | None = None
                for (tile, node), res in zip(fetch.items(), results):
                    if isinstance(res, BaseException):
                        if isinstance(res, asyncio.CancelledError):
                            raise res
                        failed = failed or (tile, node, res)
                        continue
                    have[tile], kept = res
                    if kept:
                        in_use.append(tile)
                if failed is not None:
                    tile, node, err = failed
                    raise _Fail("infra", f"pulling input {tile} from node {node} failed: {err}",
                                node=node, input=tile)
        except BaseException:
            for key in in_use:
                self.store.cache_done(key)
            raise
        return [have[t] for t in task.inputs], in_use

    async def _wait_made(self, tile: str) -> bool:
        """Wait for the task making ``tile`` here to end: has it made it? A task that has
        not arrived is waited for ``wait_for_input_s``; one running here, until it ends."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.wait_for_input_s
        while tile not in self.store:
            made = self._made.get(tile)
            if made is None:
                made = self._made[tile] = loop.create_future()
            timeout = None if tile in self._making else give_up - loop.time()
            if timeout is not None and timeout <= 0:
                if self._made.get(tile) is made and not made.done():
                    del self._made[tile]
                return False
            try:
                ok = await asyncio.wait_for(asyncio.shield(made), timeout)
            except TimeoutError:
                continue  # its task may have started meanwhile: then wait for it to end
            return ok and tile in self.store
        return True

    async def _fetch(self, node: str, tile: str) -> tuple[np.ndarray, bool]:
        """(array, in use as a cache entry): an upload tile through the cache, any other
        tile pulled for this task only."""
        if is_upload_tile(tile):
            return await self._upload(node, tile)
        arr = await self.pull(node, tile)
        self.stats["pulled_bytes"] += int(arr.nbytes)
        self.stats["peer_bytes"] += int(arr.nbytes)  # a task's output, from the executor that made it
        return arr, False

    async def _upload(self, node: str, tile: str) -> tuple[np.ndarray, bool]:
        """An upload tile not in the cache: pulled (one pull shared by every task asking
        meanwhile) and kept as a cache entry if it fits. (array, in use as a cache entry)."""
        pull = self._pulling.get(tile)
        if pull is None:
            pull = asyncio.get_running_loop().create_task(self._pull_and_keep(node, tile))
            self._pulling[tile] = pull
            pull.add_done_callback(functools.partial(self._pulled, tile))
        pulled = await asyncio.shield(pull)
        kept = self.store.cache_take(tile)  # may have been evicted meanwhile: then use ours once
        return (kept, True) if kept is not None else (pulled, False)

    def _pulled(self, tile: str, pull: asyncio.Task[np.ndarray]) -> None:
        self._pulling.pop(tile, None)
        if not pull.cancelled():
            pull.exception()  # retrieved: every task that waited for it reports it already

    async def _pull_and_keep(self, node: str, tile: str) -> np.ndarray:
        arr = await self.pull(node, tile)
        self.stats["pulled_bytes"] += int(arr.nbytes)
        self.stats["upload_pulls"] += 1
        self.store.cache_put(tile, arr)
        return arr
