"""The admin side of a scheduler (docs/api.md): node drain, job labels, paged listings of
jobs, tasks and tiles, retrying a job, and the configuration it runs with.

Paging is keyset paging (the caller passes the sort key of the previous page's last item,
``api/pages.py`` wraps it in an opaque cursor): every page is one indexed range read of the
metadb, never an OFFSET scan, so a page of a 100,000-task job costs what a page of a small
one does, and an item stored meanwhile does not shift the pages. The page reads run on the
event loop with SQLite and in a worker thread with PostgreSQL (``Admin._read`` says why).

A task's drift history: for a job the dispatcher still holds, from its in-memory log of
transitions (each drift with the node it left and the node it went to); for any other,
from the ``task.drifted`` events the journal publishes and writes for each attempt that
left a node (``task.ready`` / ``task.pending`` rows of a metadb written before the event
stream; ``to`` is known for the last one only: the task row's node).

Errors: ``NotFound`` for an unknown job or node, ``Conflict`` for a retry of a job that is
not failed or cancelled, the metadb's as ``Unavailable`` (``api/errors.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from triplane import metadb as mdb
from triplane._version import __version__
from triplane.proto.ir import Graph
from triplane.registry import list_nodes, set_drained
from triplane.scheduler.earlier import BINDINGS
from triplane.scheduler.errors import BadRequest, Conflict, NotFound
from triplane.scheduler.jobrecords import API_STATE, stored_body
from triplane.scheduler.journal import FAILED  # its payload is a failed job's error: task, node, loc

if TYPE_CHECKING:
    from triplane.scheduler.service import Scheduler

__all__ = ["DRIFT_KINDS", "Admin", "job_body"]

# an attempt that left its node (journal.py; the last two: rows written before scheduler/events.py)
DRIFT_KINDS = ("task.drifted", "task.ready", "task.pending")
RETRYABLE = ("failed", "cancelled")
JUST_ENDED_S = 2.0  # a job that ended this recently has its journal written before its rows are read
T = TypeVar("T")


def job_body(info: mdb.JobInfo, status: dict[str, Any]) -> dict[str, Any]:
    """A job's status body with what the metadb adds: owner, name and tags."""
    return {**status, "owner": info.owner, "name": info.name, "tags": list(info.tags)}


class Admin:
    """See the module doc; ``scheduler.admin``."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

    async def _read(self, read: Callable[[], T]) -> T:
        """A page's metadb read: on the event loop with SQLite (an indexed range read of at
        most 1,001 rows of a local file, about a millisecond), in a worker thread with
        PostgreSQL (a network round trip). A worker thread's read waits for the GIL at every
        hand-off while the dispatcher and the batch writer run: beside a 100,000-task job,
        p99 113-150 ms a page that way, 44-50 ms on the loop (bench/api.py, same machine)."""
        if self.s.db.dialect == "sqlite":
            return read()
        return await asyncio.to_thread(read)

    # --- nodes -------------------------------------------------------------------------------

    async def node(self, node: str) -> dict[str, Any]:
        for n in await self.s.cluster.nodes():
            if n["node"] == node:
                return n
        raise NotFound(f"unknown node {node[:128]!r} (not registered now: GET /v1/nodes lists them)")

    async def drain(self, node: str, drained: bool, by: str) -> dict[str, Any]:
        """Drain (or undrain) a registered node; its body as ``GET /v1/nodes/{node}``."""
        if node not in {n.node for n in await list_nodes(self.s.registry)}:
            raise NotFound(f"unknown node {node[:128]!r} (not registered now: GET /v1/nodes lists them)")
        await set_drained(self.s.registry, node, drained, by=by)
        await self.s.cluster.read_drained()
        self.s.events.publish("node.drained" if drained else "node.undrained", node=node, by=by)
        return await self.node(node)

    # --- jobs --------------------------------------------------------------------------------

    def status(self, job: str) -> dict[str, Any]:
        """``GET /v1/jobs/{id}``: the status body with owner, name and tags."""
        status = self.s.status(job)  # NotFound for an unknown job
        try:
            with self.s.db.read() as s:
                return job_body(mdb.get_job(s, job), status)
        except mdb.UnknownJobError:  # in memory, its rows pruned meanwhile: no labels to show
            return {**status, "owner": None, "name": None, "tags": []}

    async def label(self, job: str, name: str | None, tags: Sequence[str]) -> None:
        """Record a just-submitted job's name and tags (its row exists once submit answered)."""
        if name is None and not tags:
            return

        def write() -> None:
            with self.s.db.transaction() as s:
                mdb.set_job_labels(s, job, name, tags)

        await asyncio.to_thread(write)

    async def jobs(self, *, limit: int, before: tuple[float, str] | None, owner: str | None,
                   states: Sequence[str] | None, name: str | None, tags: Sequence[str],
                   since: float | None, until: float | None) -> list[dict[str, Any]]:
        """Up to ``limit`` jobs, newest first, after ``before`` (created_at, id); API states
        (``queued`` covers the metadb's submitted and compiling). A state filter waits for
        the journal's writes first, and a job whose state in memory differs from its row's
        is left out."""
        stored = None if states is None else [k for k, v in API_STATE.items() if v in states]
        if states is not None:  # a job's end reaches the metadb with the journal's next flush
            await self.s.journal.written()

        def read() -> list[mdb.JobInfo]:
            with self.s.db.read() as s:
                return mdb.list_jobs(s, limit=limit, states=stored, owner=owner, name=name, tags=tags,
                                     since=since, until=until, before=before)

        try:
            infos = await self._read(read)
        except mdb.InvalidInputError as e:  # a filter's value (the metadb's bounds name it)
            raise BadRequest(str(e)) from None
        jobs = self.s.jobs
        out = []
        for info in infos:
            live = jobs.live.get(info.id)
            status = jobs.body(info.id, live) if live is not None else stored_body(info, _error(info))
            if states is not None and status["state"] not in states:
                continue  # (ended after the journal's write: its row was read as it was)
            out.append(job_body(info, status))
        return out

    async def retry(self, job: str) -> dict[str, Any]:
        """A failed or cancelled job submitted again as a new job: the same graph, fetch list,
        uploads bound to its inputs, deadline, owner, name and tags (whoever retries it: a
        submit token retries only its own jobs). ``{"id", "retry_of", "state"}``."""
        def read() -> tuple[mdb.JobInfo, Graph, dict[str, Any]]:
            with self.s.db.read() as s:
                info = mdb.get_job(s, job)
                graph = Graph.from_json(mdb.get_graph(s, info.graph_hash).canonical)
                ev = mdb.list_events(s, job, limit=1, kind=BINDINGS)
            return info, graph, ev[0].payload if ev else {}

        state = self.s.status(job)["state"]  # NotFound for an unknown job
        if state not in RETRYABLE:
            raise Conflict(f"job {job} is {state}: only a failed or cancelled job is retried")
        info, graph, bindings = await asyncio.to_thread(read)
        if not isinstance(bindings.get("fetch"), dict) or not isinstance(bindings.get("args"), list):
            raise Conflict(f"job {job} has no record of its bindings: submit its graph again")
        if bindings.get("refs"):
            raise Conflict(f"job {job} read refs of other jobs: submit its graph again with the refs")
        key = graph.hash()
        known = self.s.jobs.structures.get(key)  # its nodes' source lines, if its submit is still held
        self.s.jobs.structures[key] = (graph, dict(bindings["fetch"]), tuple(info.fetch),
                                       known[3] if known is not None else {})
        deadline_s = bindings.get("deadline_s")
        body = await self.s.jobs.submit_bound(
            key, list(bindings["args"]), list(info.fetch),
            deadline_s if type(deadline_s) in (int, float) else None, owner=info.owner, step=False)
        await self.label(body["id"], info.name, info.tags)
        return {"id": body["id"], "retry_of": job, "state": body["state"]}

    # --- tasks and tiles ---------------------------------------------------------------------

    async def settled(self, job: str) -> None:
        """Before a read of ``job``'s rows: if its rows are still queued (a compiled step's
        trail its answer by up to a batch) or it ended in the last ``JUST_ENDED_S`` (its last
        transitions trail by up to a journal period), once the journal has written them."""
        live = self.s.jobs.live.get(job)
        if live is None:
            return
        ended = live.state != "running" and time.time() - live.updated < JUST_ENDED_S
        if ended or self.s.journal.inserting(job):
            await self.s.journal.written()

    async def tasks(self, job: str, *, after: str | None, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` of a job's tasks by id after ``after``, each with its drifts."""
        def read() -> tuple[list[mdb.TaskInfo], list[mdb.EventInfo]]:
            with self.s.db.read() as s:
                rows = mdb.task_page(s, job, after=after, limit=limit)
                events = mdb.task_events(s, job, [t.task_id for t in rows], DRIFT_KINDS)
                if any(t.error_kind for t in rows):  # the job's error names its failed task's node
                    events += mdb.list_events(s, job, limit=1, kind=FAILED)
                return rows, events

        await self.settled(job)
        try:
            rows, events = await self._read(read)
        except (mdb.UnknownJobError, mdb.InvalidInputError):  # the cursor's key is checked already
            raise NotFound(f"unknown job {job[:128]!r}") from None
        js = self.s.shell.state.jobs.get(job)
        stored: dict[str, list[dict[str, Any]]] = {}
        failed: dict[str, Any] = {}  # the job's error (job.failed): its task, node and loc
        for e in events:
            p = e.payload if isinstance(e.payload, dict) else {}
            if e.kind == FAILED:
                failed = p
            elif p.get("from") == "dispatched":
                stored.setdefault(e.task_id or "", []).append(
                    {"at": e.at, "attempt": int(p.get("attempt") or 0), "from": e.node or p.get("node"),
                     "to": None, "reason": e.stimulus_id or ""})
        out = []
        for t in rows:
            record = js.tasks.get(t.task_id) if js is not None else None
            drifts = _drifts(record.log) if record is not None else stored.get(t.task_id, [])
            if record is None and drifts and t.state in ("dispatched", "done") and drifts[-1]["to"] is None:
                drifts[-1]["to"] = t.node
            # A job held in memory: its record is the truth; the row may trail it by a journal
            # flush (0.2 s), so a read right after the job's end would show tasks still queued.
            # (A freed intermediate's record has no node any more: the row says where it ran.)
            state, attempt, node = ((t.state, t.attempt, t.node) if record is None
                                    else (record.state.value, record.attempt, record.node or t.node))
            out.append({
                "id": t.task_id, "op": t.op, "state": state, "attempt": attempt, "node": node,
                "queued_at": t.queued_at, "started_at": t.started_at, "finished_at": t.finished_at,
                "predicted_s": t.predicted_s, "actual_s": t.actual_s,
                "error": None if t.error_kind is None else {
                    "kind": t.error_kind, "message": t.error_message or "",
                    **self._where(job, t.task_id, failed)},
                "drifts": drifts,
            })
        return out

    def _where(self, job: str, task: str, error: dict[str, Any]) -> dict[str, Any]:
        """A failed task's submitted node and its ``loc``: from the job held in memory, else
        from the job's stored error when it names this task."""
        node, loc = self.s.jobs.locate(job, task)
        if node is None and error.get("task") == task:
            node, loc = error.get("node"), error.get("loc")
        return {"node": node if isinstance(node, str) else None, "loc": loc if isinstance(loc, str) else None}

    async def tiles(self, job: str, *, after: tuple[str, str] | None, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` of a job's tile rows (where its fetched results live) after ``after``
        (a ``plan_node`` and index key). ``tensor`` is the fetched name a row holds (the
        plan's id of the tile where it holds a part of one)."""
        def read() -> tuple[list[mdb.TileInfo], dict[str, str]]:
            with self.s.db.read() as s:
                rows = mdb.tile_page(s, job, after=after, limit=limit)
                ev = mdb.list_events(s, job, limit=1, kind=BINDINGS)
            fetch = ev[0].payload.get("fetch") if ev and isinstance(ev[0].payload, dict) else None
            return rows, {node: name for name, node in fetch.items()} if isinstance(fetch, dict) else {}

        await self.settled(job)
        try:
            rows, names = await asyncio.to_thread(read)
        except (mdb.UnknownJobError, mdb.InvalidInputError):  # the cursor's key is checked already
            raise NotFound(f"unknown job {job[:128]!r}") from None
        return [{"tensor": names.get(t.tensor, t.tensor), "plan_node": t.tensor, "index": list(t.index),
                 "shape": list(t.shape), "dtype": t.dtype, "node": t.node, "memory_engine": t.memory_engine,
                 "nbytes": t.nbytes, "state": t.state, "updated_at": t.updated_at} for t in rows]

    # --- configuration -----------------------------------------------------------------------

    def config(self, **api: Any) -> dict[str, Any]:
        """``GET /v1/config``: what this scheduler runs with (no secrets: no token, no
        cluster secret, no database password)."""
        s = self.s
        p = s.state.policy
        return {
            "version": __version__, "id": s.id, "role": s.role, "host": s.host,
            "packet_port": s.shell.port,
            "data_port": s.data_port, "elect": s.elect, "slots": s.shell.slots,
            "lease_ttl_s": s.lease_ttl_s, "resume_wait_s": s.resume_wait_s,
            "session_ttl_s": s.sessions.ttl_s, "keep_jobs": s.keep_jobs,
            "retention_period_s": s.retention_period_s, "retain_finished": s.jobs.retain,
            "group_tiny_jobs": bool(s.jobs.group), "max_upload_bytes": s.store.max_bytes,
            "metadb": s.db.engine.dialect.name, "registry": type(s.registry).__name__,
            "policy": dataclasses.asdict(p),
            "drained": sorted(s.cluster.drained),
            **api,
            "at": time.time(),
        }


def _error(info: mdb.JobInfo) -> dict[str, Any] | None:
    """A stored job's error in the API's shape (its status reads the ``job.failed`` event)."""
    return None if not info.error else {"kind": "infra", "message": info.error, "node": None, "op": None}


def _drifts(log: Sequence[Any]) -> list[dict[str, Any]]:
    """A live task's drifts from its transitions: each attempt that left a dispatched node,
    with that node and the node its next attempt went to."""
    out: list[dict[str, Any]] = []
    node = None
    for t in log:
        if t.finish == "dispatched":
            if out and out[-1]["to"] is None:
                out[-1]["to"] = t.node
            node = t.node
        elif t.start == "dispatched" and t.finish in ("ready", "pending"):
            out.append({"at": t.at, "attempt": t.attempt, "from": node, "to": None, "reason": t.stimulus_id})
    return out
