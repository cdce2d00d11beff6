"""The Scheduler: jobs in, tasks out, results back (docs/runtime.md, docs/scheduler.md).

One object owns the control plane of a process: the registry connection, the metadata
DB (with its ``BatchWriter``), the upload store and its data server, the plan cache, and
the dispatcher (pure ``DispatchState`` + asyncio ``DispatchShell``). The REST app
(``triplane.scheduler.api``) is a thin layer over its public coroutines.

Failure semantics:

* ``submit`` validates, stores and compiles before it answers, and refuses (``SubmitError``,
  a 400/503 for the API) a graph it could never run: malformed, an op no registered engine
  supports, an unknown upload, or no executor at all. Nothing is half-submitted: the job
  is stored (with its tasks) in one transaction, then handed to the dispatcher.
* Task transitions reach metadb in batches (one commit per batch, not per task); a done
  task's row (state, node) is where its output tile lives. Fetched outputs also get a
  ``tiles`` row (shape, dtype, bytes), in the same batches.
* On start (and when a standby becomes leader) non-terminal jobs are resumed from metadb:
  tasks recorded done on a live executor count as done, the rest run again. A done job
  that an earlier process ran keeps its results and plan (``earlier.py``): fetched from
  the executors its task rows name, until a ``DELETE`` (recorded as ``job.released``).
* With ``elect=True`` (etcd) the scheduler campaigns for ``scheduler/leader`` and serves
  as a standby until it wins; job calls then raise ``NotLeader`` naming the leader. If it
  loses the lease, it stops (``stopped`` is set) rather than risk two leaders.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triplane import metadb as mdb
from triplane.metadb.models import Job as JobRow
from triplane.net.dataport import DataClient, DataPortError, DataServer
from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph
from triplane.registry import (
    Leadership,
    OpEngineInfo,
    RegistryBackend,
    leader,
    list_nodes,
    list_op_engines,
)
from triplane.scheduler.calibration import Calibration, bound_of
from triplane.scheduler.compiler.costmodel import NodeFigures, figures_from_registry, task_cost
from triplane.scheduler.compiler.pipeline import PlanCache
from triplane.scheduler.dispatch.shell import DispatchShell, Hooks
from triplane.scheduler.dispatch.state import (
    CancelJob,
    DispatchState,
    JobFinished,
    Policy,
    SubmitJob,
)
from triplane.scheduler.earlier import (
    REBUILD_ERRORS,
    EarlierJobs,
    placed_now,
    plan_again,
    read_recorded_plan,
    read_released,
    record_released,
    recorded_document,
)
from triplane.scheduler.fetching import FetchError, open_tiled
from triplane.scheduler.jobplan import JobPlan, TaskTemplate, new_job_id, plan_job, prepare, unsupported_op
from triplane.scheduler.journal import Journal
from triplane.scheduler.layout import (
    MODEL,
    figures_to_json,
    same_host_figures,
    structure_hash,
)
from triplane.scheduler.leading import Leading
from triplane.scheduler.planview import plan_document
from triplane.scheduler.residency import Residency, read_evictions
from triplane.scheduler.store import StoredTensor, TensorStore, UploadTiles

log = logging.getLogger(__name__)

VERSION = "0.1.0"
_TASK_OVERHEAD_S = MODEL.task_overhead_s  # what placement adds to each kernel
STORE_FIRST_TASKS = 1000  # a job of at most this many tasks is stored before it is dispatched

_API_STATE = {
    "submitted": "queued",
    "compiling": "queued",
    "running": "running",
    "done": "done",
    "failed": "failed",
    "cancelled": "cancelled",
}


class SubmitError(Exception):
    """A request the scheduler refuses: ``status`` (400, 404, 409, 503) and the error body."""

    def __init__(
        self, status: int, kind: str, message: str, *, node: str | None = None, op: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"kind": kind, "message": message, "node": node, "op": op}


class NotLeader(SubmitError):
    def __init__(self, leader_id: str | None) -> None:
        who = f"the leader is {leader_id}" if leader_id else "no leader is elected yet"
        super().__init__(503, "standby", f"this scheduler is a standby; {who}")
        self.leader_id = leader_id


@dataclass
class LiveJob:
    """A job this process dispatches (or finished since it started)."""

    plan: JobPlan
    back: dict[str, str]  # plan node id -> submitted node id (for errors)
    created: float
    updated: float
    state: str = "running"
    error: dict[str, Any] | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    fetched_released: bool = False
    fetched_tasks: frozenset[str] = frozenset()  # tasks holding fetched tiles (tiles table)
    actual: dict[str, tuple[float, float]] = field(default_factory=dict)  # task -> kernel start, end
    # node -> (flops, bytes) calibration factors the plan was made with (None: a resumed
    # job, planned with recorded figures; its tasks teach the calibration nothing)
    factors: dict[str, tuple[float, float]] | None = None
    # task -> node holding its output, kept when the job is done: fetches need it after the
    # dispatcher's state is gone (a scheduler that stepped down and leads again).
    holders: dict[str, str] = field(default_factory=dict)

    def name_of(self, task: str) -> str:
        """The submitted node a task came from (a tile task: the tensor it is part of)."""
        lay = self.plan.layout
        nid = lay.origin.get(task, task) if lay is not None and lay.tiled else task
        return self.back.get(nid, nid)


def graph_error_kind(e: GraphError) -> str:
    names = {
        "UnknownOpError": "unknown_op",
        "ShapeError": "shape",
        "DTypeError": "dtype",
        "AttrError": "attr",
        "LimitError": "limit",
        "PlacementError": "placement",
    }
    return names.get(type(e).__name__, "graph")


class Scheduler(Leading):
    """See the module docstring. Create, ``await start()``, ``await close()``."""

    def __init__(
        self,
        *,
        registry: RegistryBackend,
        db: mdb.MetaDB,
        run_dir: Path,
        secret: bytes,
        host: str = "127.0.0.1",
        packet_port: int = 0,
        data_port: int = 0,
        scheduler_id: str | None = None,
        elect: bool = False,
        slots: int = 2,
        policy: Policy | None = None,
        tick_s: float = 0.025,
        max_upload_bytes: int = 1 << 30,
        lease_ttl_s: float = 5.0,
    ) -> None:
        self.registry = registry
        self.db = db
        self.run_dir = Path(run_dir)
        self.secret = secret
        self.host = host
        self.id = scheduler_id or f"{host}-{id(self):x}"
        self.elect = elect
        self.lease_ttl_s = lease_ttl_s
        self.role = "standby" if elect else "leader"
        self.store = TensorStore(self.run_dir / "tensors", max_upload_bytes)
        self.data_server = DataServer(UploadTiles(self.store), secret)
        self.data_client = DataClient(secret, io_timeout=10.0)
        self.plans = PlanCache()
        self.state = DispatchState(policy)
        self.templates: dict[str, dict[str, TaskTemplate]] = {}
        self.journal = Journal(db, self._progress)
        self.shell = DispatchShell(
            self.state,
            secret,
            self.templates,
            Hooks(self._finished, self.journal.transitions, self._output, self._node_down),
            tick_s=tick_s,
            slots=slots,
        )
        self.jobs: dict[str, LiveJob] = {}
        self.earlier = EarlierJobs(db, self.plans)  # done jobs an earlier process ran
        self.residency = Residency()  # upload tiles cached on executors, for placement
        self.calibration = Calibration()  # how fast executors run now, from finished tasks
        self.stopped = asyncio.Event()
        self._packet_port, self._data_port = packet_port, data_port
        self.data_port = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._leadership: Leadership | None = None
        self._lead_tasks: list[asyncio.Task[Any]] = []
        self._data_lease = 0
        self._data_keepalive: Any = None
        self.policy = policy
        self._figs: tuple[float, list[NodeFigures], list[OpEngineInfo]] = (0.0, [], [])

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.data_port = await self.data_server.start(self.host, self._data_port)
        await self.shell.start(self.host, self._packet_port)
        self.journal.open()
        self._tasks.append(loop.create_task(self.journal.run(), name="scheduler-journal"))
        if self.elect:
            self._tasks.append(loop.create_task(self._campaign(), name="scheduler-campaign"))
        else:
            await self._lead()

    async def close(self) -> None:
        for t in self._lead_tasks:
            t.cancel()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.shell.close()
        await self.data_server.close()
        await self.data_client.close()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.journal.close)
        if self._leadership is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._leadership.resign(), 3.0)
        if self._data_lease:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.registry.revoke_lease(self._data_lease), 3.0)

    async def _resume(self, live_nodes: set[str]) -> None:
        resumed = await asyncio.to_thread(self._load_resumable)
        for info, cgraph, bindings, tasks in resumed:
            try:
                plan = plan_again(info.id, cgraph, bindings, self.plans)
            except REBUILD_ERRORS as e:  # not a graph we accepted
                await asyncio.to_thread(self._set_failed, info.id, f"cannot resume: {e}")
                continue
            # A done task's row names the node holding its output tile (docs/scheduler.md).
            done = tuple(
                (t.task_id, t.node)
                for t in tasks
                if t.state == "done" and t.node in live_nodes and t.task_id in plan.templates
            )
            self._dispatch(plan, info.created_at, done)
            log.info("resumed job %s (%d of %d tasks already done)", info.id, len(done), len(plan.specs))

    def _load_resumable(self) -> list[tuple[mdb.JobInfo, Graph, dict[str, Any], tuple[mdb.TaskInfo, ...]]]:
        out = []
        with self.db.read() as s:
            for r in mdb.jobs_to_resume(s):
                if r.job.id in self.jobs:
                    continue
                g = Graph.from_json(mdb.get_graph(s, r.job.graph_hash).canonical)
                ev = mdb.list_events(s, r.job.id, limit=1)
                bindings = ev[0].payload if ev and ev[0].kind == "job.bindings" else {}
                out.append((r.job, g, bindings, r.tasks))
        return out

    def _set_failed(self, job: str, error: str) -> None:
        with self.db.transaction() as s:
            mdb.set_job_state(s, job, "failed", error=error)

    # --- jobs ---------------------------------------------------------------------------------

    async def require_leader(self) -> None:
        if self.role != "leader":
            raise NotLeader(await leader(self.registry))

    async def submit(self, graph_doc: Any, fetch: Any) -> dict[str, Any]:
        """Validate, store, compile and dispatch a job; its status body. SubmitError otherwise."""
        await self.require_leader()
        if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch) or len(fetch) > 10_000:
            raise SubmitError(400, "request", "'fetch' must be a list of at most 10000 node ids")
        figures, engines = await self._registry_view()
        factors = self.calibration.snapshot([f.name for f in figures])
        figures = self.calibration.apply(figures, factors)  # the speed the executors run at now
        try:
            cgraph, args, plan = await asyncio.to_thread(self._plan, graph_doc, fetch, figures)
        except GraphError as e:
            raise SubmitError(400, graph_error_kind(e), str(e), node=e.node, op=e.op) from None
        job_id, fetch_map = plan.job, plan.fetch
        bindings: dict[str, Any] = {"args": list(args), "fetch": fetch_map}
        if plan.layout is not None and plan.layout.tiled:
            bindings["figures"] = figures_to_json(plan.layout.figures)
        if len(json.dumps(bindings)) > 60_000:
            raise SubmitError(
                400,
                "limit",
                f"{len(args)} uploaded inputs and {len(fetch)} fetched names "
                "do not fit one job's record; submit fewer at once",
            )
        back = plan.back
        for nid, tensor in plan.uploads.items():
            stored = self.store.get(tensor)
            node = plan.plan.graph.nodes[nid]
            if stored is None:
                raise SubmitError(
                    400, "graph", f"unknown uploaded tensor {tensor!r}", node=back.get(nid, nid), op="input"
                )
            if stored.shape != tuple(node.shape) or stored.dtype != node.dtype:
                raise SubmitError(
                    400,
                    "graph",
                    f"uploaded tensor {tensor} is {stored.dtype}"
                    f"{list(stored.shape)}, the graph declares {node.dtype}{list(node.shape)}",
                    node=back.get(nid, nid),
                    op="input",
                )
        if plan.specs:
            if not self.shell.nodes and not engines:
                raise SubmitError(503, "unavailable", "no executor is registered")
            missing = unsupported_op(plan.ops, (e.ops for e in engines))
            if missing is not None:
                nid = next(n for n, t in plan.templates.items() if t.op == missing)
                raise SubmitError(
                    400,
                    "unknown_op",
                    f"no registered executor engine supports op {missing!r}",
                    node=back.get(nid, nid),
                    op=missing,
                )
        now = time.time()
        store_first = len(plan.specs) <= STORE_FIRST_TASKS
        if store_first:
            # A job of few tasks is stored first (milliseconds): its tasks are big, and a
            # store running beside them would take CPU and the GIL from the replies when
            # the executors fill every core (the MLP step: 30-80 ms between a task's reply
            # and its successor's start early in the job, 1 ms once the store was done).
            try:
                await asyncio.to_thread(self._store_job, plan, cgraph, fetch, bindings, now)
            except Exception as e:
                raise _store_failed(job_id, e) from None
            return self._body(job_id, self._dispatch(plan, now, (), back, factors))
        # Dispatch first and store meanwhile: the executors start while ~10^4 task rows are
        # inserted. The journal holds the job's writes back until its rows exist.
        self.journal.hold(job_id)
        live = self._dispatch(plan, now, (), back, factors)
        try:
            await asyncio.to_thread(self._store_job, plan, cgraph, fetch, bindings, now)
        except Exception as e:
            self.shell.handle(CancelJob(f"store-failed:{job_id}", job_id, time.time()))
            self.jobs.pop(job_id, None)
            self.journal.forget(job_id)
            raise _store_failed(job_id, e) from None
        finally:
            self.journal.release(job_id)
        return self._body(job_id, live)

    def _plan(
        self, graph_doc: Any, fetch: list[str], figures: list[NodeFigures]
    ) -> tuple[Graph, list[str], JobPlan]:
        # CPU-bound (parse, canonicalise, compile, tile, place): run in a thread so that the
        # event loop keeps answering replies, health checks and the registry's keep-alives.
        graph = Graph.from_dict(graph_doc)
        cgraph, rename, args = prepare(graph, fetch)
        fetch_map = {name: rename[name] for name in fetch}
        plan = plan_job(
            new_job_id(), cgraph, args, fetch_map, {v: k for k, v in rename.items()}, self.plans,
            figures=figures, cached=self.residency.lookup(args),
        )
        return cgraph, args, plan

    async def _registry_view(self, max_age_s: float = 1.0) -> tuple[list[NodeFigures], list[OpEngineInfo]]:
        """The executors' figures and op engines (registry), read at most once per
        ``max_age_s``: a burst of submits (a training loop) does not read the registry for
        each one, and submit checks the ops against the engines read with the figures."""
        at, figs, engines = self._figs
        now = time.monotonic()
        if now - at > max_age_s or not figs:
            nodes = await list_nodes(self.registry)
            hosts = {n.node: n.address for n in nodes}
            figs = same_host_figures(await figures_from_registry(self.registry), hosts,
                                     {n.node: n.cpus for n in nodes})
            engines = await list_op_engines(self.registry)
            self._figs = (now, figs, engines)
            if len(self.residency):
                await read_evictions(self.registry, self.residency)
        return figs, engines

    def _store_job(
        self, plan: JobPlan, cgraph: Graph, fetch: list[str], bindings: dict[str, Any], now: float
    ) -> None:
        # The canonical graph is stored (its hash and JSON are already computed for the plan
        # cache); the bindings event holds what else a restarted scheduler needs.
        with self.db.transaction() as s:
            mdb.create_job(
                s,
                graph_hash=cgraph.hash(),
                graph_json=cgraph.to_json(),
                fetch=fetch,
                job_id=plan.job,
                state="running",
                now=now,
                node_count=len(cgraph.nodes),
            )
            mdb.insert_tasks(
                s,
                plan.job,
                [
                    mdb.NewTask(t.id, t.op, "ready" if not t.deps else "pending", predicted_s=t.cost_s)
                    for t in plan.specs
                ],
            )
            mdb.add_events(s, [mdb.NewEvent(plan.job, "job.bindings", at=now, payload=bindings)])
            lay = plan.layout
            if lay is not None and lay.placement is not None:
                # The prediction on record, so the run's actual times can be set beside it.
                info = mdb.upsert_plan(
                    s,
                    graph_hash=cgraph.hash(),
                    structure_hash=structure_hash(lay.figures),
                    plan=plan_document(plan.job, lay, plan.back, {}, complete=False),
                    predicted_makespan=lay.placement.makespan,
                    now=now,
                )
                row = s.get(JobRow, plan.job)
                if row is not None:
                    row.plan_id = info.id

    def _dispatch(
        self,
        plan: JobPlan,
        created: float,
        done: tuple[tuple[str, str], ...],
        back: dict[str, str] | None = None,
        factors: dict[str, tuple[float, float]] | None = None,
    ) -> LiveJob:
        live = LiveJob(plan, back or {}, created, time.time(), factors=factors)
        live.fetched_tasks = frozenset(self._fetched_tasks_of(plan))
        self.jobs[plan.job] = live
        self.templates[plan.job] = dict(plan.templates)
        self.shell.handle(SubmitJob(f"submit:{plan.job}", plan.job, plan.specs, time.time(), done))
        return live

    def status(self, job: str) -> dict[str, Any]:
        live = self.jobs.get(job)
        if live is not None:
            return self._body(job, live)
        try:
            with self.db.read() as s:
                info = mdb.get_job(s, job)
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            raise SubmitError(404, "not_found", f"unknown job {job!r}") from None
        return {
            "id": info.id,
            "state": _API_STATE[info.state],
            "progress": {"done": info.tasks_done, "total": info.tasks_total},
            "error": {"kind": "infra", "message": info.error, "node": None, "op": None}
            if info.error
            else None,
            "created": info.created_at,
            "updated": info.updated_at,
        }

    def _body(self, job: str, live: LiveJob) -> dict[str, Any]:
        js = self.state.jobs.get(job)
        total = len(live.plan.specs)
        done = total - js.remaining if js is not None else 0
        return {
            "id": job,
            "state": live.state,
            "progress": {"done": done, "total": total},
            "error": live.error,
            "created": live.created,
            "updated": live.updated,
        }

    def list_jobs(self, limit: int = 50) -> list[dict[str, Any]]:
        with self.db.read() as s:
            infos = mdb.list_jobs(s, limit=limit)
        return [
            self._body(i.id, self.jobs[i.id])
            if i.id in self.jobs
            else {
                "id": i.id,
                "state": _API_STATE[i.state],
                "progress": {"done": i.tasks_done, "total": i.tasks_total},
                "error": i.error,
                "created": i.created_at,
                "updated": i.updated_at,
            }
            for i in infos
        ]

    async def wait(self, job: str, timeout: float) -> dict[str, Any]:
        """The status body once the job ends or ``timeout`` seconds pass."""
        live = self.jobs.get(job)
        if live is not None and live.state == "running":
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(live.ended.wait(), max(0.0, timeout))
        return self.status(job)

    async def cancel(self, job: str) -> dict[str, Any]:
        """Cancel a running job and release its tiles (a finished job's too)."""
        await self.require_leader()
        live = self.jobs.get(job)
        if live is None:
            body = self.status(job)  # 404 for an unknown job
            if body["state"] == "done":  # run by an earlier process: its tiles are still held
                await self._release_earlier(job)
            return body
        if live.state == "running":
            self.shell.handle(CancelJob(f"cancel:{job}", job, time.time()))
        released = live.fetched_released
        await self._release(job, keep_fetched=False)
        if not released:
            await self._record_released(job)
        return self._body(job, live)

    async def _record_released(self, job: str) -> None:
        # A later scheduler process must not serve the deleted tiles' job as fetchable.
        try:
            await asyncio.to_thread(record_released, self.db, job)
        except mdb.MetaDBError as e:
            log.error("cannot record the release of job %s: %s", job, e)

    async def _release_earlier(self, job: str) -> None:
        """Delete the fetched tiles of a done job an earlier process ran, and record it."""
        if await asyncio.to_thread(read_released, self.db, job):
            return
        try:
            view = await self.earlier.get(job)
        except REBUILD_ERRORS as e:
            log.warning("cannot rebuild job %s to release its tiles: %s", job, e)
        else:
            by_node: dict[str, list[str]] = defaultdict(list)
            for task in self._fetched_tasks_of(view.plan) if view.plan is not None else ():
                if task in view.holders:
                    by_node[view.holders[task]].append(f"{job}.{task}")
            await self._delete_tiles(job, by_node)
        await self._record_released(job)

    async def open_tensor(
        self, job: str, name: str
    ) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
        """(shape, dtype, bytes, chunks) of a fetched tensor. SubmitError 404/409 otherwise.

        A done job that an earlier scheduler process ran is served the same way: its plan
        is compiled again from the metadb and its tiles read where its task rows say they
        are (``earlier.py``); a standby answers NotLeader (it tracks no executors)."""
        live = self.jobs.get(job)
        if live is None:
            return await self._open_earlier(job, name)
        if name not in live.plan.fetch:
            raise _not_fetched(job, name, live.plan.fetch)
        if live.state != "done":
            raise SubmitError(
                409, "not_ready", f"job {job} is {live.state}; results are read when it is done"
            )
        if live.fetched_released:
            raise SubmitError(404, "not_found", f"the tensors of job {job} were released")
        return await self._open_held(job, name, live.plan, live.holders)

    async def _open_earlier(
        self, job: str, name: str
    ) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
        """open_tensor for a job not run by this process (see there)."""
        await self.require_leader()
        try:
            view = await self.earlier.get(job)
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            raise SubmitError(404, "not_found", f"unknown job {job!r}") from None
        except REBUILD_ERRORS as e:
            raise SubmitError(
                404, "not_found", f"job {job} was run by an earlier scheduler process and its plan "
                f"cannot be rebuilt from the metadb: {e}"
            ) from None
        if name not in view.fetch:
            raise _not_fetched(job, name, view.fetch)
        if view.state != "done" or view.plan is None:
            state = _API_STATE.get(view.state, view.state)
            raise SubmitError(409, "not_ready", f"job {job} is {state}; results are read when it is done")
        if await asyncio.to_thread(read_released, self.db, job):
            raise SubmitError(404, "not_found", f"the tensors of job {job} were released")
        return await self._open_held(job, name, view.plan, view.holders)

    async def _open_held(
        self, job: str, name: str, plan: JobPlan, holders: dict[str, str]
    ) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
        """Stream ``name`` of a done job from the executors that ``holders`` (task -> node) name."""
        grid = plan.fetch_grid(name)
        if grid is not None and len(grid) > 1:
            return await self._open_tiled(job, name, grid, holders)
        tile, task = plan.fetch_tile(name)
        if task is None:
            t = self.store.get(tile)
            if t is None:
                raise SubmitError(404, "not_found", f"uploaded tensor {tile} is gone")
            data = self.store.data(tile)

            async def one() -> AsyncIterator[bytes]:
                yield bytes(data)

            return t.shape, t.dtype, t.nbytes, one()
        node = holders.get(task)
        info = self.shell.nodes.get(node or "")
        if info is None:
            raise SubmitError(404, "not_found", _gone(job, name, tile, node))
        try:
            return await self.data_client.open_tile(info.address, info.data_port, tile)
        except DataPortError as e:
            raise SubmitError(
                404 if e.missing else 503,
                "not_found" if e.missing else "unavailable",
                f"cannot read {name!r} of job {job} (tile {tile}) from {node}: {e}",
            ) from None

    async def _open_tiled(
        self, job: str, name: str, grid: Any, holders: dict[str, str]
    ) -> tuple[tuple[int, ...], str, int, AsyncIterator[bytes]]:
        ids = {t: f"{job}.{t}" for t in grid.tiles.values()}
        by_tile = {v: k for k, v in ids.items()}

        def holder(tile: str) -> tuple[str, int] | None:
            info = self.shell.nodes.get(holders.get(by_tile[tile]) or "")
            return None if info is None else (info.address, info.data_port)

        try:
            return await open_tiled(self.data_client, grid, ids, holder)
        except FetchError as e:
            node = holders.get(by_tile[e.tile])
            raise SubmitError(404, "not_found", _gone(job, name, e.tile, node)) from None

    async def plan(self, job: str) -> dict[str, Any]:
        """Explain's JSON for a job (docs/runtime.md, ``GET /v1/jobs/{id}/plan``): predictions,
        and actual times of the tasks that ran. For a job an earlier process ran: the
        prediction recorded at submit (``recorded: true``) with the kernel times its task
        rows hold, or for a done job too small to have been placed at submit, a placement
        for the executors there are now (``recorded: false``). 404 for an unknown job or
        one with neither."""
        live = self.jobs.get(job)
        if live is None:
            return await self._earlier_plan(job)
        lay = live.plan.layout
        if lay is None:
            raise SubmitError(409, "not_ready", f"job {job} was not laid out (no executor was registered)")
        try:
            # A snapshot taken on the loop; placing a tiny job on demand is CPU work for a thread.
            return await asyncio.to_thread(
                plan_document, job, lay, dict(live.back), dict(live.actual), complete=live.state == "done"
            )
        except (GraphError, ValueError) as e:
            raise SubmitError(413, "limit", str(e)) from None

    async def _earlier_plan(self, job: str) -> dict[str, Any]:
        try:
            info, doc, times = await asyncio.to_thread(read_recorded_plan, self.db, job)
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            raise SubmitError(404, "not_found", f"unknown job {job!r}") from None
        if doc is not None:
            return recorded_document(job, doc)
        if info.state == "done":
            try:
                view = await self.earlier.get(job)
            except REBUILD_ERRORS as e:
                raise SubmitError(404, "not_found", f"job {job}'s plan cannot be rebuilt: {e}") from None
            figs, _ = await self._registry_view()
            if view.plan is not None and view.plan.layout is None and figs:  # not tiled
                try:
                    return await asyncio.to_thread(placed_now, job, view.plan, figs, times)
                except (GraphError, ValueError) as e:
                    raise SubmitError(413, "limit", str(e)) from None
        raise SubmitError(
            404, "not_found", f"job {job} was run by an earlier scheduler process and no prediction "
            "was recorded for it (a job too small to tile is placed on demand, once it is done "
            "and while executors are registered)"
        )

    def upload(self, data: bytes | bytearray, shape: tuple[int, ...], dtype: str) -> StoredTensor:
        return self.store.put(data, shape, dtype)

    async def nodes(self) -> list[dict[str, Any]]:
        infos = await list_nodes(self.registry)
        return [
            {
                **_asdict(n),
                "health": "up",
                "running": len(self.state.nodes[n.node].running) if n.node in self.state.nodes else 0,
                # how much slower than registered its kernels run now (calibration.py)
                "calibration": {b: self.calibration.factor(n.node, b) for b in ("flops", "bytes")},
            }
            for n in infos
        ]

    async def engines(self) -> list[dict[str, Any]]:
        return [_asdict(e) for e in await list_op_engines(self.registry)]

    # --- hooks from the shell (event loop; never block) -------------------------------------------

    def _finished(self, f: JobFinished) -> None:
        live = self.jobs.get(f.job)
        if live is None:
            return
        live.state = f.state
        live.updated = time.time()
        if f.state == "failed":
            live.error = self._failure(f)
        js = self.state.jobs[f.job]
        if f.state == "done":
            live.holders = {tid: t.node for tid, t in js.tasks.items() if t.node}
        done = len(js.tasks) - js.remaining
        self.journal.job_ended(f.job, f.state, done, live.error["message"] if live.error else None)
        live.ended.set()
        asyncio.get_running_loop().create_task(self._release(f.job, keep_fetched=True))

    def _failure(self, f: JobFinished) -> dict[str, Any]:
        live = self.jobs[f.job]
        for t in self.state.jobs[f.job].tasks.values():
            if t.state == "failed":
                kind = "infra" if "gave up after" in (t.error or "") else "user"
                return {
                    "kind": kind,
                    "message": t.error or f.error or "failed",
                    "node": live.name_of(t.spec.id),
                    "op": t.spec.op,
                }
        return {"kind": "infra", "message": f.error or "failed", "node": None, "op": None}

    def _progress(self, job: str) -> tuple[bool, int]:
        js = self.state.jobs.get(job)
        return (False, 0) if js is None else (js.state == "running", len(js.tasks) - js.remaining)

    def _output(self, job: str, task: str, node: str, r: Any) -> None:
        tpl = self.templates.get(job, {}).get(task)
        if tpl is not None and tpl.uploads:
            self.residency.learn(node, tpl.uploads)  # the executor keeps what it read
        live = self.jobs.get(job)
        if live is not None:
            live.actual[task] = (r.timings.start, r.timings.end)
            if live.factors is not None:
                self._calibrate(live, task, node, r.timings.end - r.timings.start)
        # The kernel's times ride on the task's done row update (so a later process can show
        # them in the job's plan). Only the results a client will read get a tiles row: every
        # other output's location is its task row (done, node), written anyway -- 10^4 tile
        # rows per job cost the scheduler more CPU than the tasks themselves (docs/scheduler.md).
        self.journal.output(job, task, node, r, tiles=live is None or task in live.fetched_tasks)

    def _calibrate(self, live: LiveJob, task: str, node: str, kernel_s: float) -> None:
        """Teach the calibration what ``task``'s kernel took beside its prediction."""
        lay = live.plan.layout
        if lay is None or lay.placement is None:
            return
        tp = lay.placement.tasks.get(task)
        predicted = tp.compute_s - _TASK_OVERHEAD_S if tp is not None else 0.0
        if tp is None or tp.node != node or predicted < self.calibration.min_predicted_s:
            return
        fig = next((f for f in lay.figures if f.name == node), None)
        if fig is None:
            return
        bound = bound_of(task_cost(lay.graph, task), fig)
        ff, fb = (live.factors or {}).get(node, (1.0, 1.0))
        self.calibration.observe(node, bound, predicted, kernel_s, ff if bound == "flops" else fb)

    @staticmethod
    def _fetched_tasks_of(plan: JobPlan) -> set[str]:
        keep: set[str] = set()
        for name, nid in plan.fetch.items():
            grid = plan.fetch_grid(name)
            keep.update(grid.tiles.values() if grid is not None else (nid,))
        return keep

    def _node_down(self, node: str) -> None:
        log.warning("executor %s is gone", node)
        self.residency.forget_node(node)
        self.calibration.forget(node)

    async def _release(self, job: str, *, keep_fetched: bool) -> None:
        """Delete a job's tiles on the executors (the fetched ones too unless ``keep_fetched``)."""
        live, js = self.jobs.get(job), self.state.jobs.get(job)
        if live is None:
            return
        # A running job's tiles are where the dispatcher last put them; a done one's are
        # in its holders (which outlive the dispatcher's state).
        holders = {t.spec.id: t.node for t in js.tasks.values() if t.node} if js else live.holders
        keep = self._fetched_tasks_of(live.plan) if keep_fetched else set()
        by_node: dict[str, list[str]] = defaultdict(list)
        for task, node in holders.items():
            if task not in keep:
                by_node[node].append(f"{job}.{task}")
        if not keep_fetched:
            live.fetched_released = True
        await self._delete_tiles(job, by_node)

    async def _delete_tiles(self, job: str, by_node: dict[str, list[str]]) -> None:
        for node, tiles in by_node.items():
            info = self.shell.nodes.get(node)
            if info is None:
                continue
            try:
                await self.data_client.delete(info.address, info.data_port, tiles)
            except Exception as e:  # best effort: the executor frees them with its memory anyway
                log.debug("releasing %d tiles of %s on %s failed: %s", len(tiles), job, node, e)


def _store_failed(job: str, e: Exception) -> SubmitError:
    log.error("cannot store job %s: %s", job, e)
    return SubmitError(503, "unavailable", f"the metadata DB refused the job: {e}")


def _not_fetched(job: str, name: str, fetched: Any) -> SubmitError:
    return SubmitError(
        404, "not_found", f"job {job} did not fetch {name!r} (fetched: {sorted(fetched)[:20]})", node=name
    )


def _gone(job: str, name: str, tile: str, node: str | None) -> str:
    where = f"was held by node {node}, which is gone" if node else "has no recorded holder"
    return f"tile {tile} of tensor {name!r} of job {job} {where}"


def _asdict(record: Any) -> dict[str, Any]:
    import dataclasses

    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(record).items()}
