"""The Scheduler: the composition root of a scheduler process (docs/scheduler.md).

It builds the components and wires them to one another; each has one job:

* ``jobs.Jobs``         submit, status, long-poll, cancel, list, resume; the live-job table
* ``results.Results``   fetched tensors, plans with actual times, release of tiles
* ``cluster.ClusterView`` the registry's executors, their calibration and cached uploads;
                        the snapshot the compiler (``compiler/compile.py``) plans with
* ``sessions.Sessions`` client session leases: what a client holds, freed when it ends
* ``leading.Leading``   leader election, the ``scheduler/data`` record, resume on taking the lead
* the dispatcher (pure ``DispatchState`` + asyncio ``DispatchShell``), the metadb
  ``Journal`` (batched writes), the upload ``TensorStore`` and its data server.
* ``events.EventBus``   the event stream (``GET /v1/events``), written by the journal
* ``metrics.Metrics``   the Prometheus metrics (``GET /metrics``), counted in the hooks

The REST app (``triplane.scheduler.api``) is a thin layer over the coroutines below; they
raise domain errors (``triplane/scheduler/errors.py``) that know no status code.

Failure semantics: see the components. On start (and when a standby becomes leader) the
unfinished jobs of the metadb are resumed once the executors their done task rows name
have registered again (at most ``resume_wait_s``): an executor that kept its tiles keeps
its tasks done. With ``elect=True`` (etcd) the scheduler campaigns for
``scheduler/leader`` and serves as a standby until it wins; job calls then raise
``Standby`` naming the leader. If it loses the lease it steps down and campaigns again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from triplane import metadb as mdb
from triplane._version import __version__
from triplane.engines.memory.persist import PERSIST_ENV, persist_targets
from triplane.net.dataport import DataClient, DataPortError, DataServer
from triplane.proto.packet import Carried
from triplane.registry import Leadership, NodeInfo, RegistryBackend, leader, list_memory_engines
from triplane.scheduler.admin import Admin
from triplane.scheduler.cluster import ClusterView
from triplane.scheduler.compiler.jobplan import TaskTemplate, is_tensor_id, tile_id
from triplane.scheduler.compiler.pipeline import PlanCache
from triplane.scheduler.dispatch.shell import DispatchShell, Hooks
from triplane.scheduler.dispatch.state import (
    CancelJob,
    DispatchState,
    Free,
    JobFinished,
    Policy,
    Send,
    Transitioned,
)
from triplane.scheduler.earlier import EarlierJobs
from triplane.scheduler.errors import Conflict, NotFound, SchedulerError, Standby
from triplane.scheduler.events import EventBus
from triplane.scheduler.freeing import TileFreer
from triplane.scheduler.jobs import RETAIN_FINISHED, Jobs
from triplane.scheduler.journal import Journal
from triplane.scheduler.leading import Leading
from triplane.scheduler.lineage import Lineage
from triplane.scheduler.livejob import LiveJob
from triplane.scheduler.metrics import Counts, Metrics
from triplane.scheduler.refs import Refs, refs_by_job
from triplane.scheduler.results import Opened, Results
from triplane.scheduler.retention import KEEP_JOBS, PERIOD_S, retain
from triplane.scheduler.sessions import DEFAULT_TTL_S, Held, Sessions, reap, release_held
from triplane.scheduler.store import StoredTensor, TensorStore, UploadTiles

log = logging.getLogger(__name__)

VERSION = __version__  # api/app.py reports it
INLINE_MAX_BYTES = 64 * 1024  # values a submit that waits answers inline (api/waiting.py)


class Scheduler(Leading):
    """See the module doc. Create, ``await start()``, ``await close()``."""

    def __init__(
        self,
        *,
        registry: RegistryBackend,
        db: mdb.MetaDB,
        run_dir: Path,
        secret: bytes,
        host: str = "127.0.0.1",
        advertise: str | None = None,
        packet_port: int = 0,
        data_port: int = 0,
        scheduler_id: str | None = None,
        elect: bool = False,
        slots: int = 2,
        policy: Policy | None = None,
        tick_s: float = 0.025,
        max_upload_bytes: int = 1 << 30,
        lease_ttl_s: float = 5.0,
        retain_finished: int = RETAIN_FINISHED,
        resume_wait_s: float | None = None,
        session_ttl_s: float = DEFAULT_TTL_S,
        group_tiny_jobs: bool = True,
        keep_jobs: int | None = KEEP_JOBS,
        retention_period_s: float = PERIOD_S,
    ) -> None:
        self.registry = registry
        self.db = db
        self.run_dir = Path(run_dir)
        self.secret = secret
        self.host = host  # where it listens (0.0.0.0: every interface)
        self.address = advertise or host  # what executors are told (scheduler/data)
        self.id = scheduler_id or f"{self.address}-{id(self):x}"
        self.elect = elect
        self.lease_ttl_s = lease_ttl_s
        # Executors re-register within a lease's time of the registry coming back.
        self.resume_wait_s = lease_ttl_s + 2.0 if resume_wait_s is None else resume_wait_s
        self.role = "standby" if elect else "leader"
        self.policy = policy
        self.stopped = asyncio.Event()
        # metadb retention (scheduler/retention.py): None keeps every job's rows
        self.keep_jobs, self.retention_period_s = keep_jobs, retention_period_s

        self.store = TensorStore(self.run_dir / "tensors", max_upload_bytes)
        self.data_server = DataServer(UploadTiles(self.store), secret)
        self.data_client = DataClient(secret, io_timeout=10.0)
        self.plans = PlanCache()
        live: dict[str, LiveJob] = {}  # the live-job table: jobs and results share it
        self.templates: dict[str, dict[str, TaskTemplate]] = {}
        self.shell = DispatchShell(DispatchState(policy), secret, self.templates, Hooks(),
                                   tick_s=tick_s, slots=slots)
        self.cluster = ClusterView(registry, self._running_on)
        self.shell.carry = self._carry
        self.cluster.on_drained = self._drained
        self.results = Results(db=db, store=self.store, data_client=self.data_client, shell=self.shell,
                               cluster=self.cluster, earlier=EarlierJobs(db, self.plans), live=live,
                               require_leader=self.require_leader)
        self.events = EventBus(db)
        self.journal = Journal(db, lambda job: self.jobs.progress(job), self.events, lambda: self.shell.state)
        self.results.journal = self.journal
        self._inline: dict[str, list[str]] = {}  # job -> its own uploads (sent inline, copies of refs)
        self.refs = Refs(live=live, results=self.results, shell=self.shell, store=self.store,
                         job_uploads=self._inline)
        self.jobs = Jobs(db=db, store=self.store, shell=self.shell, journal=self.journal, plans=self.plans,
                         cluster=self.cluster, results=self.results, live=live, templates=self.templates,
                         require_leader=self.require_leader, refs=self.refs, retain=retain_finished,
                         group=group_tiny_jobs)
        self.results.lineage = Lineage(self.jobs, self.results)  # lost tiles of done jobs, run again
        # Persistence targets ($TRIPLANE_PERSIST_TO, engines/memory/persist.py): a job asking to
        # persist names one; a fetch reads a tile there when its holder is gone.
        self.jobs.persist = self.results.persist = persist_targets(os.environ.get(PERSIST_ENV))
        self.sessions = Sessions(session_ttl_s)
        self.admin = Admin(self)
        self.freer = TileFreer(self.data_client, self._data_address)
        self.counts = Counts(lambda: self.shell.state)
        self.events.sinks.append(self.counts.event)
        self.metrics = Metrics(self.counts, self._metric_sources)
        self.shell.hooks = Hooks(self._finished, self._transitions, self.jobs.output,
                                 self._node_down, self._free, self._sending, self._node_up)

        self._packet_port, self._data_port = packet_port, data_port
        self.data_port = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._leadership: Leadership | None = None
        self._lead_tasks: list[asyncio.Task[Any]] = []
        self._data_lease = 0
        self._data_keepalive: Any = None
        self._up: set[str] = set()  # executors up, for node.up / node.down events

    @property
    def state(self) -> DispatchState:
        """The dispatcher's state (replaced when the scheduler steps down)."""
        return self.shell.state

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.data_port = await self.data_server.start(self.host, self._data_port)
        await self.shell.start(self.host, self._packet_port)
        self.journal.open()
        self._tasks.append(loop.create_task(self.journal.run(), name="scheduler-journal"))
        self._tasks.append(loop.create_task(reap(self.sessions, self.release_upload, self._release_job),
                                            name="scheduler-sessions"))
        if self.keep_jobs is not None:
            self._tasks.append(loop.create_task(
                retain(self.db, self.keep_jobs, lambda: self.role == "leader", lambda: self.journal.writer,
                       period_s=self.retention_period_s), name="scheduler-retention"))
        if self.elect:
            self._tasks.append(loop.create_task(self._campaign(), name="scheduler-campaign"))
        else:
            await self._lead()

    async def close(self) -> None:
        await self.results.close()
        for t in self._lead_tasks:
            t.cancel()
        for t in self._tasks:
            t.cancel()
        for t in [*self._tasks, *self._lead_tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.shell.close()
        await self.freer.close()
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

    async def require_leader(self) -> None:
        if self.role != "leader":
            raise Standby(await leader(self.registry))

    def _drained(self, nodes: frozenset[str]) -> None:
        self.shell.state.drained = nodes  # the dispatcher places nothing new there

    def _running_on(self, node: str) -> int:
        n = self.shell.state.nodes.get(node)
        return len(n.running) if n is not None else 0

    def _finished(self, f: JobFinished) -> None:
        self.counts.finished(f)
        self.jobs.finished(f)

    def _transitions(self, ts: list[Transitioned]) -> None:
        self.journal.transitions(ts)
        self.counts.transitions(ts)

    def _metric_sources(self) -> dict[str, Any]:
        """What ``GET /metrics`` reads rather than counts (``metrics.SchedulerCollector``)."""
        st, s = self.shell.state, self.shell.stats
        return {"queued": max(0, self.counts.queued),
                "running": sum(len(n.running) for n in st.nodes.values()),
                "jobs_running": sum(1 for j in st.jobs.values() if j.state == "running"),
                "plan_cache": (self.plans.hits, self.plans.misses), "sent": s.sent, "resent": s.resent,
                "replies": s.replies, "events": self.events.published, "subscribers": self.events.subscribers}

    async def refresh_metrics(self) -> None:
        """Read the executors' memory engine records for ``/metrics`` (at most once a second)."""
        if self.metrics.memory_stale():
            self.metrics.set_memory(await list_memory_engines(self.registry))

    def _node_up(self, info: NodeInfo) -> None:
        if info.node not in self._up:  # not for a registration renewed or updated
            self._up.add(info.node)
            self.events.publish("node.up", node=info.node, address=info.address)

    def _node_down(self, node: str) -> None:
        log.warning("executor %s is gone", node)
        if node in self._up:
            self._up.discard(node)
            self.events.publish("node.down", node=node)
        self.cluster.node_down(node)
        asyncio.get_running_loop().call_soon(self._refs_lost, node)

    def _refs_lost(self, node: str) -> None:
        """A running job reading a ref held on ``node`` cannot get it any more: it fails
        (kind "lost"). Not for a node merely suspected (a peer's pull failed; it is probed
        and comes back if it answers): its registration expiring takes it down for good."""
        if node in self.shell.nodes or self.shell.suspected(node):
            return
        for job, r in self.refs.lost_on(node):
            live = self.jobs.live.get(job)
            if live is None or live.state != "running":
                continue
            live.failure = {"kind": "lost", "message": f"ref {r.ref}: its value (tile {r.tile}) was held by "
                            f"executor {node}, which is gone", "node": None, "op": None, "ref": r.ref}
            self.shell.handle(CancelJob(f"lost:{job}", job, time.time()))

    # intermediate tiles (docs/scheduler.md, "Intermediates"): deleted in batches per node
    def _free(self, f: Free) -> None:
        self.freer.free(f.node, tile_id(f.job, f.task))

    def _sending(self, s: Send) -> None:
        if self.freer.queued_on(s.node):  # per task sent: no tile id made while nothing waits
            self.freer.sending(s.node, tile_id(s.job, s.task))

    def _carry(self, node: str, tile: str) -> Carried | None:
        """An upload's value for a grouped task's packet to carry (``DispatchShell.carry``):
        small and in memory here, and not cached on ``node`` already."""
        return None if node in self.cluster.residency.holders(tile) else self.store.carried(tile)

    def _data_address(self, node: str) -> tuple[str, int] | None:
        info = self.shell.nodes.get(node)
        return None if info is None else (info.address, info.data_port)

    # --- the API's calls (docs/runtime.md) ----------------------------------------------------

    async def submit(self, graph_doc: Any, fetch: Any, deadline_s: float | None = None, *,
                     owner: str | None = None, grad: tuple[str, list[str]] | None = None,
                     persist: str | None = None, name: str | None = None,
                     tags: Sequence[str] = (), prefer: str | None = None) -> dict[str, Any]:
        """Submit a job (``Jobs.submit``); its ``name`` and ``tags`` are recorded before
        this answers (``Admin.label``)."""
        body = await self.jobs.submit(graph_doc, fetch, deadline_s, owner=owner, grad=grad, persist=persist,
                                      prefer=prefer)
        await self.admin.label(body["id"], name, tags)
        return body

    async def submit_bound(self, plan_hash: str, args: Sequence[str | tuple[bytes, tuple[int, ...], str]],
                           fetch: list[str], deadline_s: float | None = None, prefer: str | None = None,
                           await_refs_s: float = 0.0, inline_refs: Sequence[str] = (), *,
                           owner: str | None = None) -> dict[str, Any]:
        """A compiled step (``Jobs.submit_bound``); inline arguments (raw bytes, shape,
        dtype) are stored as uploads first, once the plan is known to exist. With
        ``inline_refs`` the body has ``ref_values`` (``inline_values`` of each ref's job,
        once done; a job still running after ``await_refs_s`` gives none)."""
        known = self.jobs.structures.get(plan_hash)
        if known is None or known[2] != tuple(fetch):
            raise Conflict(f"unknown plan {plan_hash[:16]!r} for this fetch list: submit the graph",
                           kind="unknown_plan")
        inline = {i: self.store.put(*a, owner, held=True).id  # in memory only, no file
                  for i, a in enumerate(args) if not isinstance(a, str)}
        ids = [inline.get(i, a) for i, a in enumerate(args)]
        try:
            body = await self.jobs.submit_bound(plan_hash, ids, fetch, deadline_s, prefer, await_refs_s,
                                                owner=owner)
        except BaseException:
            for u in inline.values():
                await self.release_upload(u)
            raise
        if inline:  # the job's own inputs: they go when the job is released (beside its ref copies)
            self._inline.setdefault(body["id"], []).extend(inline.values())
        if inline_refs:
            values: dict[str, Any] = {}
            for job, names in refs_by_job(inline_refs).items():  # (the job is submitted: nothing may raise)
                try:
                    done = (await self.jobs.wait(job, await_refs_s))["state"] == "done"
                except SchedulerError:  # unknown: the client's fetch says so
                    continue
                if done:
                    got = await self.inline_values(job, names)
                    values.update((f"{job}:{n}", v) for n, v in got.items())
            body = {**body, "ref_values": values}
        return body

    def status(self, job: str) -> dict[str, Any]:
        return self.jobs.status(job)

    async def copy(self, refs: Sequence[str], owner: str | None = None) -> list[str]:
        """``POST /v1/tensors/copy``: each ref's value stored as an upload of ``owner``
        (``Refs.copy``; its errors)."""
        await self.require_leader()
        return await self.refs.copy(refs, owner)

    async def waited(self, answer: dict[str, Any], wait_s: float, inline: Sequence[str]) -> dict[str, Any]:
        """A submit's ``answer`` once its job is terminal or ``wait_s`` passed (``api/waiting.py``):
        with ``job``, its status's ``state``, ``progress`` and ``error``, and ``values``: each
        ``inline`` name of at most ``INLINE_MAX_BYTES`` of a done job, as ``{"shape", "dtype",
        "data": <base64 of its raw little-endian C-order bytes>}``."""
        job = answer["id"]
        status = await self.jobs.wait(job, wait_s)  # the job's end is an asyncio.Event: no polling
        values = await self.inline_values(job, inline) if status["state"] == "done" else {}
        return {"job": job, **answer, "state": status["state"], "progress": status["progress"],
                "error": status["error"], "values": values}

    async def inline_values(self, job: str, names: Sequence[str]) -> dict[str, Any]:
        """Each of ``names`` (fetched outputs of the done ``job``) of at most
        ``INLINE_MAX_BYTES``, as ``{"shape", "dtype", "data": base64}``; the others, and
        any that cannot be read (released, its holder gone), are left out: fetched as usual."""
        values: dict[str, Any] = {}
        for name in names:
            size = self.results.fetched_nbytes(job, name)
            if size is None or size > INLINE_MAX_BYTES:
                continue
            try:
                shape, dtype, _, chunks = await self.results.open_tensor(job, name)
                data = b"".join([c async for c in chunks])
            except (SchedulerError, DataPortError) as e:  # the fetch says why
                log.info("inline value %r of job %s left out: %s", name, job, e)
                continue
            values[name] = {"shape": list(shape), "dtype": dtype, "data": base64.b64encode(data).decode()}
        return values

    async def wait(self, job: str, timeout: float) -> dict[str, Any]:
        return await self.jobs.wait(job, timeout)

    async def cancel(self, job: str) -> dict[str, Any]:
        return await self.jobs.cancel(job)

    async def open_tensor(self, job: str, name: str) -> Opened:
        return await self.results.open_tensor(job, name)

    async def plan(self, job: str) -> dict[str, Any]:
        return await self.results.plan(job)

    def upload(self, data: bytes | bytearray, shape: tuple[int, ...], dtype: str,
               owner: str | None = None) -> StoredTensor:
        return self.store.put(data, shape, dtype, owner)

    async def release_upload(self, upload: str) -> bool:
        """Delete an upload (files, executor cache entries); whether it was known."""
        self.sessions.untag_upload(upload)
        return await self.results.release_upload(upload)

    async def release_job(self, job: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``: cancel if running, release its tiles (and the inputs a
        compiled step sent inline, stored as uploads of the job)."""
        self.sessions.untag_job(job)
        return await self._release_job(job)

    async def release_many(self, ids: Sequence[str]) -> None:
        """The ``release`` of a job request (``api/waiting.py``): each job released as by
        :meth:`release_job`, each upload as by :meth:`release_upload`; an unknown one is
        skipped, a failure logged."""
        for ident in ids:
            try:
                if is_tensor_id(ident):
                    await self.release_upload(ident)
                else:
                    await self.release_job(ident)
            except NotFound:
                pass
            except Exception as e:  # the answer is sent: nobody to tell but the log
                log.warning("releasing %s after a submit failed: %s", ident, e)

    async def _release_job(self, job: str) -> dict[str, Any]:
        body = await self.jobs.cancel(job)
        inline = self._inline.pop(job, ())
        for upload in inline:
            self.sessions.untag_upload(upload)
        if inline:
            await self.results.release_uploads(inline)
        return body

    async def end_session(self, sid: str) -> Held:
        """Close a session and release what it still holds."""
        held = self.sessions.close(sid)
        await release_held(held, self.release_upload, self._release_job)
        return held

    async def nodes(self) -> list[dict[str, Any]]:
        return await self.cluster.nodes()

    async def engines(self) -> list[dict[str, Any]]:
        return await self.cluster.engines()

