"""What jobs produced: their fetched tensors, their plans with actual times, and the
release of their tiles (and of uploads) on the executors (docs/runtime.md, docs/scheduler.md).

A job in the live table (``jobs.py``) is served from memory; any other -- run by an
earlier process, or finished long enough ago to have left memory -- from the metadb: its
plan compiled again (``earlier.py``) and its tiles read where its task rows say they are,
until a ``DELETE`` (recorded as ``job.released``).

Errors (domain errors, ``triplane/scheduler/errors.py``): ``NotFound`` for an unknown job,
a name the job did not fetch, released tensors or a tile whose holder is gone;
``NotReady`` while the job has not finished; ``Unavailable`` when the executor holding a
tile does not answer; ``TooLarge`` for a plan too large to place on demand; ``Standby`` on
a standby (it tracks no executors).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from triplane import metadb as mdb
from triplane.engines.errors import MissingTileError
from triplane.net.dataport import DataClient, DataPortError
from triplane.proto import dtypes as dt
from triplane.proto.errors import GraphError
from triplane.scheduler.cluster import ClusterView
from triplane.scheduler.compiler.jobplan import JobPlan, is_job_tile
from triplane.scheduler.compiler.planview import plan_document
from triplane.scheduler.dispatch.shell import DispatchShell
from triplane.scheduler.earlier import (
    REBUILD_ERRORS,
    RELEASED,
    EarlierJobs,
    placed_now,
    read_recorded_plan,
    read_released,
    record_released,
    recorded_document,
)
from triplane.scheduler.errors import NotFound, NotReady, TooLarge, Unavailable
from triplane.scheduler.fetching import FetchError, open_tiled
from triplane.scheduler.freeing import TileFreer
from triplane.scheduler.jobrecords import API_STATE
from triplane.scheduler.livejob import LiveJob, fetched_tasks_of
from triplane.scheduler.store import TensorStore

if TYPE_CHECKING:
    from triplane.scheduler.journal import Journal
    from triplane.scheduler.lineage import Lineage

log = logging.getLogger("triplane.scheduler.service")

Opened = tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]  # shape, dtype, bytes, chunks

# A task running when its job is cancelled (or an attempt drifted away from, still running)
# stores its output when its kernel ends, after the release deleted its tiles: the release
# is repeated this long after (seconds, one after the other). Deleting a tile that is not
# there is no error.
LATE_RELEASE_S = (1.0, 4.0, 25.0)
RELEASE_BATCH_S = 0.02  # how long a release's deletions wait for others to the same executor


class Results:
    """Tensors, plans and tile releases of jobs (see the module doc)."""

    def __init__(
        self,
        *,
        db: mdb.MetaDB,
        store: TensorStore,
        data_client: DataClient,
        shell: DispatchShell,
        cluster: ClusterView,
        earlier: EarlierJobs,
        live: dict[str, LiveJob],
        require_leader: Callable[[], Awaitable[None]],
    ) -> None:
        self.db, self.store, self.data_client, self.shell = db, store, data_client, shell
        self.cluster, self.earlier, self.live = cluster, earlier, live
        self.require_leader = require_leader
        self._late: set[asyncio.Task[None]] = set()
        # a release's deletions, batched per executor (one request per node for the releases of
        # ``RELEASE_BATCH_S``: a training loop releases a step per step)
        self.releaser = TileFreer(data_client, self._address, interval_s=RELEASE_BATCH_S, batch=4096)
        # job -> how many running jobs read its tiles by ref (refs.py): its tiles stay until
        # they end; a release meanwhile is carried out then (the deletions wait here)
        self._pins: dict[str, int] = {}
        self._deferred: dict[str, list[dict[str, list[str]]]] = {}
        self.persist: dict[str, Any] = {}  # kind -> persistence target (set by the service)
        self.journal: Journal | None = None  # writes a release with its batches (set by the service)
        self.persisted_reads = 0
        self.lineage: Lineage | None = None  # recomputes lost tiles of done jobs (set by the service)

    # --- tensors -----------------------------------------------------------------------------

    async def open_tensor(self, job: str, name: str) -> Opened:
        """(shape, dtype, bytes, chunks) of a fetched tensor of a done job; a tile whose
        holder is gone and that no persistence target keeps is computed again (lineage.py)."""
        await self.settled(job)
        live = self.live.get(job)
        if live is None:
            return await self._open_earlier(job, name)
        if name not in live.plan.fetch:
            raise _not_fetched(job, name, live.plan.fetch)
        if live.state != "done":
            raise NotReady(f"job {job} is {live.state}; results are read when it is done")
        if live.fetched_released:
            raise NotFound(f"the tensors of job {job} were released")
        if live.carried:
            c = live.carried.get(_single_tile(live.plan, name) or "")
            if c is not None:  # its task's reply carried it
                return c.shape, c.dtype, len(c.data), _chunk(c.data)
        return await self._open_held(job, name, live.plan, live.holders)

    def fetched_nbytes(self, job: str, name: str) -> int | None:
        """The size of fetched ``name`` of a job in memory (None otherwise)."""
        live = self.live.get(job)
        nid = live.plan.fetch.get(name) if live is not None else None
        return None if nid is None else live.plan.plan.graph.nodes[nid].type.nbytes  # type: ignore[union-attr]

    async def _open_earlier(self, job: str, name: str) -> Opened:
        await self.require_leader()
        try:
            view = await self.earlier.get(job)
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            raise NotFound(f"unknown job {job!r}") from None
        except REBUILD_ERRORS as e:
            raise NotFound(f"job {job} was run by an earlier scheduler process and its plan "
                           f"cannot be rebuilt from the metadb: {e}") from None
        if name not in view.fetch:
            raise _not_fetched(job, name, view.fetch)
        if view.state != "done" or view.plan is None:
            state = API_STATE.get(view.state, view.state)
            raise NotReady(f"job {job} is {state}; results are read when it is done")
        if await asyncio.to_thread(read_released, self.db, job):
            raise NotFound(f"the tensors of job {job} were released")
        return await self._open_held(job, name, view.plan, view.holders)

    async def _open_held(self, job: str, name: str, plan: JobPlan, holders: dict[str, str]) -> Opened:
        """Stream ``name`` of a done job from the executors that ``holders`` (task -> node) name."""
        grid = plan.fetch_grid(name)
        if grid is not None and len(grid) > 1:
            holders = await self.recover(job, plan, holders, grid.tiles.values())
            return await self._open_tiled(job, name, grid, holders)
        tile, task = plan.fetch_tile(name)
        if task is None and is_job_tile(tile):  # an input bound to a ref: the other job's tile
            owner, _, task = tile.partition(".")
            live = self.live.get(owner)
            try:
                view = live if live is not None else await self.earlier.get(owner)
                holders, task = view.holders, view.plan.task_of(task) if view.plan is not None else task
            except (mdb.MetaDBError, *REBUILD_ERRORS) as e:
                raise NotFound(f"{name!r} of job {job} is tile {tile} of job {owner}, unknown now: {e}",
                               node=name) from None
        elif task is None:
            t = self.store.get(tile)
            if t is None:
                raise NotFound(f"uploaded tensor {tile} is gone")
            return t.shape, t.dtype, t.nbytes, _chunk(bytes(self.store.data(tile)))
        node = holders.get(task)
        info = self.shell.nodes.get(node or "")
        if info is None:
            kept = await self._persisted(tile)
            if kept is not None:
                return kept
            node = (await self.recover(job, plan, holders, [task])).get(task)
            info = self.shell.nodes.get(node or "")
            if info is None:
                raise NotFound(_gone(job, name, tile, node))
        try:
            return await self.data_client.open_tile(info.address, info.data_port, tile)
        except DataPortError as e:
            kept = await self._persisted(tile)  # its holder died (not noticed yet) or lost it
            if kept is not None:
                return kept
            why = f"cannot read {name!r} of job {job} (tile {tile}) from {node}: {e}"
            raise (NotFound(why) if e.missing else Unavailable(why)) from None

    async def settled(self, job: str) -> None:
        """Once a recompute of the job's lost tiles under way (lineage.py) ended."""
        if self.lineage is not None:
            await self.lineage.settled(job)

    async def recover(self, job: str, plan: JobPlan, holders: dict[str, str],
                      tasks: Iterable[str]) -> dict[str, str]:
        """The job's holders after computing again those of ``tasks`` that were lost (no live
        holder, no persisted copy); NotFound saying why when they cannot be."""
        if self.lineage is None:
            return holders
        return await self.lineage.recover(job, plan, holders, tasks)

    async def _persisted(self, tile: str) -> Opened | None:
        """``tile`` read from a persistence target that keeps it (its holder is gone), else None."""
        for kind, target in self.persist.items():
            try:
                arr = await asyncio.to_thread(target.get, tile)
            except MissingTileError:
                continue
            self.persisted_reads += 1
            log.info("tile %s read from the %s persistence target (its holder is gone)", tile, kind)
            return tuple(arr.shape), dt.dtype(arr.dtype).name, arr.nbytes, _chunk(arr.tobytes())
        return None

    async def _open_tiled(self, job: str, name: str, grid: Any, holders: dict[str, str]) -> Opened:
        ids = {t: f"{job}.{t}" for t in grid.tiles.values()}
        by_tile = {v: k for k, v in ids.items()}

        def holder(tile: str) -> tuple[str, int] | None:
            info = self.shell.nodes.get(holders.get(by_tile[tile]) or "")
            return None if info is None else (info.address, info.data_port)

        async def kept(tile: str) -> Any:
            for target in self.persist.values():
                try:
                    arr = await asyncio.to_thread(target.get, tile)
                except MissingTileError:
                    continue
                self.persisted_reads += 1
                return arr
            return None

        try:
            has = lambda tile: any(tile in t for t in self.persist.values())  # noqa: E731
            targets = (has, kept) if self.persist else None
            return await open_tiled(self.data_client, grid, ids, holder, targets)
        except FetchError as e:
            raise NotFound(_gone(job, name, e.tile, holders.get(by_tile[e.tile]))) from None

    # --- plans -------------------------------------------------------------------------------

    async def plan(self, job: str) -> dict[str, Any]:
        """Explain's JSON for a job (docs/runtime.md, ``GET /v1/jobs/{id}/plan``): predictions,
        and actual times of the tasks that ran. For a job not in memory: the prediction
        recorded at submit (``recorded: true``) with the kernel times its task rows hold, or
        for a done job too small to have been placed at submit, a placement for the
        executors there are now (``recorded: false``). NotFound for an unknown job or one
        with neither."""
        live = self.live.get(job)
        if live is None:
            return await self._earlier_plan(job)
        lay = live.plan.layout
        if lay is None:
            raise NotReady(f"job {job} was not laid out (no executor was registered)")
        try:
            # A snapshot taken on the loop; placing a tiny job on demand is CPU work for a thread.
            return await asyncio.to_thread(
                plan_document, job, lay, dict(live.back), dict(live.actual), complete=live.state == "done"
            )
        except (GraphError, ValueError) as e:
            raise TooLarge(str(e)) from None

    async def _earlier_plan(self, job: str) -> dict[str, Any]:
        try:
            info, doc, times = await asyncio.to_thread(read_recorded_plan, self.db, job)
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            raise NotFound(f"unknown job {job!r}") from None
        if doc is not None:
            return recorded_document(job, doc)
        if info.state == "done":
            try:
                view = await self.earlier.get(job)
            except REBUILD_ERRORS as e:
                raise NotFound(f"job {job}'s plan cannot be rebuilt: {e}") from None
            figs, _ = await self.cluster.figures()
            if view.plan is not None and view.plan.layout is None and figs:  # not tiled
                try:
                    return await asyncio.to_thread(placed_now, job, view.plan, figs, times)
                except (GraphError, ValueError) as e:
                    raise TooLarge(str(e)) from None
        raise NotFound(
            f"job {job} was run by an earlier scheduler process and no prediction "
            "was recorded for it (a job too small to tile is placed on demand, once it is done "
            "and while executors are registered)"
        )

    # --- releases ----------------------------------------------------------------------------

    async def release(self, job: str, live: LiveJob, *, keep_fetched: bool) -> None:
        """Delete a job's tiles on the executors (the fetched ones too unless ``keep_fetched``)."""
        # A running job's tiles are where the dispatcher last put them; a finished one's are
        # in its holders (the dispatcher forgets the job when it ends).
        js = self.shell.state.jobs.get(job)
        holders = {t.spec.id: t.node for t in js.tasks.values() if t.node} if js else live.holders
        keep = fetched_tasks_of(live.plan) if keep_fetched else set()
        by_node: dict[str, list[str]] = defaultdict(list)
        for task, node in holders.items():
            if task not in keep:
                by_node[node].extend(live.plan.task_tiles(task))
        if not keep_fetched:
            live.fetched_released = True
        await self._delete_tiles(job, by_node)
        # Only an attempt still running can store a tile after this: none of a job done with
        # every task run once (a compiled step: 3 more deletes per step otherwise).
        if not keep_fetched and by_node and (live.state != "done" or live.retried):
            self._release_again(job, by_node)

    def _release_again(self, job: str, by_node: dict[str, list[str]]) -> None:
        async def again() -> None:
            for wait_s in LATE_RELEASE_S:
                await asyncio.sleep(wait_s)
                await self._delete_tiles(job, by_node)

        task = asyncio.get_running_loop().create_task(again(), name=f"release-again-{job}")
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    async def close(self) -> None:
        """Stop the repeated releases and send the batched deletions (the scheduler is closing)."""
        for task in list(self._late):
            task.cancel()
        with contextlib.suppress(Exception):
            await self.releaser.flush()
        await self.releaser.close()

    def _address(self, node: str) -> tuple[str, int] | None:
        info = self.shell.nodes.get(node)
        return None if info is None else (info.address, info.data_port)

    async def release_earlier(self, job: str) -> None:
        """Delete the fetched tiles of a done job not in memory, and record it."""
        if await asyncio.to_thread(read_released, self.db, job):
            return
        try:
            view = await self.earlier.get(job)
        except REBUILD_ERRORS as e:
            log.warning("cannot rebuild job %s to release its tiles: %s", job, e)
        else:
            by_node: dict[str, list[str]] = defaultdict(list)
            for task in fetched_tasks_of(view.plan) if view.plan is not None else ():
                if task in view.holders:
                    by_node[view.holders[task]].extend(view.plan.task_tiles(task))
            await self._delete_tiles(job, by_node)
        await self.record_released(job)

    async def release_upload(self, upload: str) -> bool:
        """Delete an upload's files and its cache entries on the executors known to keep
        them (residency); whether the store knew it. An executor that keeps a copy the
        scheduler did not learn of evicts it as any cache entry, when memory is asked."""
        return (await self.release_uploads([upload]))[0]

    async def release_uploads(self, uploads: Sequence[str]) -> list[bool]:
        """:meth:`release_upload` of each, their cache entries deleted with one data-port
        request per executor (a compiled step's inline inputs, when its job is released)."""
        known: list[bool] = []
        by_node: dict[str, list[str]] = defaultdict(list)
        for upload in uploads:
            # a compiled step's inline input is held in memory: no file I/O, no thread hop
            known.append(self.store.delete(upload) if self.store.is_held(upload) else
                         await asyncio.to_thread(self.store.delete, upload))
            for node, tiles in self.cluster.residency.drop(upload).items():
                by_node[node].extend(tiles)
        if by_node:
            await self._delete_tiles(uploads[0], dict(by_node))
        return known

    async def record_released(self, job: str) -> None:
        """Record a release, so that no later process serves the deleted tiles: with the
        journal's next batch when its writer knows the job (a compiled step: no transaction
        of its own), else in a worker thread."""
        if self.journal is not None:
            self.journal.released(job)
            if self.journal.note(job, RELEASED):
                return
        try:
            await asyncio.to_thread(record_released, self.db, job)
        except mdb.MetaDBError as e:
            log.error("cannot record the release of job %s: %s", job, e)

    def pin(self, job: str) -> None:
        """A running job reads ``job``'s tiles (a ref): releasing them waits for :meth:`unpin`."""
        self._pins[job] = self._pins.get(job, 0) + 1

    def unpin(self, job: str) -> None:
        """A reader of ``job``'s tiles ended: the last one carries out the releases that waited."""
        left = self._pins.get(job, 0) - 1
        if left > 0:
            self._pins[job] = left
            return
        self._pins.pop(job, None)
        waiting = self._deferred.pop(job, None)
        if waiting:
            async def carry_out() -> None:
                for by_node in waiting:
                    await self._delete_tiles(job, by_node)

            task = asyncio.get_running_loop().create_task(carry_out(), name=f"release-unpinned-{job}")
            self._late.add(task)
            task.add_done_callback(self._late.discard)

    async def _delete_tiles(self, job: str, by_node: dict[str, list[str]]) -> None:
        if job in self._pins and by_node:
            self._deferred.setdefault(job, []).append(by_node)
            return
        orphans: list[str] = []  # tiles of holders that are gone: maybe kept in a persistence target
        for node, tiles in by_node.items():
            if node not in self.shell.nodes:
                orphans.extend(tiles)
                continue
            for tile in tiles:  # sent within RELEASE_BATCH_S, with the other releases' (best effort:
                self.releaser.free(node, tile)  # the executor frees them with its memory anyway)
        if orphans:
            await self._delete_persisted(job, orphans)

    async def _delete_persisted(self, job: str, tiles: list[str]) -> None:
        """Delete ``tiles``, whose holders died, from the shared persistence targets: through
        the scheduler's own targets, else through a live executor's data port (an executor
        deletes a tile from its targets as from its memory). Without either they stay."""
        if self.persist:
            def erase() -> None:
                for target in self.persist.values():
                    for tile in tiles:
                        target.delete(tile)

            try:
                await asyncio.to_thread(erase)
            except Exception as e:  # a target that is down: the tiles stay, as before the release
                log.warning("deleting %d persisted tiles of %s failed: %s", len(tiles), job, e)
            return
        for node, info in list(self.shell.nodes.items()):
            try:
                await self.data_client.delete(info.address, info.data_port, tiles)
                return
            except Exception as e:
                log.debug("deleting %d persisted tiles of %s through %s failed: %s", len(tiles), job, node, e)


def _not_fetched(job: str, name: str, fetched: Any) -> NotFound:
    return NotFound(f"job {job} did not fetch {name!r} (fetched: {sorted(fetched)[:20]})", node=name)


def _gone(job: str, name: str, tile: str, node: str | None) -> str:
    where = f"was held by node {node}, which is gone" if node else "has no recorded holder"
    return f"tile {tile} of tensor {name!r} of job {job} {where}"


def _single_tile(plan: JobPlan, name: str) -> str | None:
    """The one tile holding fetched ``name`` (None: split into several)."""
    try:
        return plan.fetch_tile(name)[0]
    except ValueError:
        return None


async def _chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data
