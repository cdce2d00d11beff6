"""The jobs of a scheduler: submit, status, long-poll, cancel, list and resume, and the
table of the jobs this process dispatches (docs/scheduler.md).

Failure semantics:

* ``submit`` validates, compiles (``compiler/compile.py``, in a worker thread) and stores
  before it answers, and refuses a graph it could never run: ``GraphError`` (its kind names
  what is wrong, it names the node and op) for a malformed graph, an unknown or mistyped
  upload or an op no registered engine supports; ``BadRequest`` for a malformed fetch list;
  ``Unavailable`` with no executor at all or when the metadb refuses the job. Nothing is
  half-submitted: the job is stored (with its tasks) in one transaction, then dispatched --
  or, for a job of more than ``STORE_FIRST_TASKS`` tasks and for a grouped job (one task:
  a compiled step), dispatched while it is stored and cancelled if the store fails.
* A finished job (done, failed, cancelled) leaves the dispatcher's state at once (its
  holders -- task -> node keeping its output tile -- are kept on the job), and the
  ``retain`` most recent finished jobs stay in memory (and any that ended less than
  ``RETAIN_MIN_S`` ago); older ones are dropped, and their
  status, tensors and plan are served from the metadb like those of a job an earlier
  process ran (``earlier.py``). The scheduler's memory is flat over any number of jobs.
* ``resume`` dispatches the unfinished jobs of the metadb again: a task whose row says done
  on an executor that is registered counts as done (its row names the node holding its
  output tile), the others run again.
* Every call that changes jobs checks leadership first (``Standby`` on a standby).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from triplane import metadb as mdb
from triplane.proto.autograd import named_gradients
from triplane.proto.errors import GraphError, LimitError, UnknownOpError
from triplane.proto.infer import BoundTypes, graph_from_wire, type_of
from triplane.proto.ir import Graph, TensorType
from triplane.proto.packet import Reply
from triplane.scheduler.cluster import ClusterView, Factors
from triplane.scheduler.compiler.compile import ClusterSnapshot, compile_job
from triplane.scheduler.compiler.group import GROUP_OP
from triplane.scheduler.compiler.jobplan import JobPlan, TaskTemplate, is_tensor_id, unsupported_op
from triplane.scheduler.compiler.pipeline import CompileOptions, PlanCache
from triplane.scheduler.dispatch.shell import DispatchShell
from triplane.scheduler.dispatch.state import CancelJob, JobFinished, SubmitJob
from triplane.scheduler.earlier import BINDINGS, REBUILD_ERRORS, plan_again
from triplane.scheduler.errors import BadRequest, Conflict, NotFound, Unavailable
from triplane.scheduler.jobrecords import (
    bindings_of,
    is_small,
    small_job_rows,
    store_failed,
    store_job,
    stored_body,
)
from triplane.scheduler.journal import FAILED, Journal
from triplane.scheduler.livejob import LiveJob, fetched_tasks_of, prefer_node
from triplane.scheduler.refs import Held, Refs, refs_in_args, refs_in_graph
from triplane.scheduler.store import TensorStore

if TYPE_CHECKING:
    from triplane.scheduler.results import Results

log = logging.getLogger("triplane.scheduler.service")

STORE_FIRST_TASKS = 1000  # a job of at most this many tasks is stored before it is dispatched
RETAIN_FINISHED = 64  # finished jobs kept in memory; older ones are served from the metadb
# ... and none leaves before this many seconds since it ended: the journal writes a job's
# last task rows (where its tiles are) 0.2-0.3 s after its end, and a job read back from the
# metadb must find them all.
RETAIN_MIN_S = 2.0
MAX_FETCH = 10_000
INLINE_COMPILE_NODES = 256  # a compiled step of at most this many nodes is laid out on the loop
INLINE_STORE_TASKS = 4  # a grouped job of at most this many tasks is stored on the loop


# a structure submit_bound runs again: (canonical graph, fetch map, fetch list, node -> loc)
Structure = tuple[Graph, dict[str, str], tuple[str, ...], Mapping[str, str]]
GradRequest = tuple[str, list[str]]  # a job's ``grad``: (of, wrt)

# (the job as stored, its canonical graph, its job.bindings payload, its task rows)
Resumable = tuple[mdb.JobInfo, Graph, dict[str, Any], tuple[mdb.TaskInfo, ...]]


class Jobs:
    """Submit, status, wait, cancel, list and resume; ``live`` is the table of the jobs
    this process runs or finished recently (shared with :class:`~triplane.scheduler.
    results.Results`). ``finished``, ``output`` and ``progress`` are the dispatcher's
    hooks (event loop; they never block)."""

    def __init__(
        self,
        *,
        db: mdb.MetaDB,
        store: TensorStore,
        shell: DispatchShell,
        journal: Journal,
        plans: PlanCache,
        cluster: ClusterView,
        results: Results,
        live: dict[str, LiveJob],
        templates: dict[str, dict[str, TaskTemplate]],
        require_leader: Callable[[], Awaitable[None]],
        refs: Refs,
        retain: int = RETAIN_FINISHED,
        group: bool = True,
    ) -> None:
        self.db, self.store, self.shell, self.journal = db, store, shell, journal
        self.group = group  # tiny jobs of a few nodes run as one grouped task (compiler/group.py)
        self.plans, self.cluster, self.results = plans, cluster, results
        self.live = live
        self.templates = templates
        self.require_leader = require_leader
        self.refs = refs
        self.retain = retain
        self.persist: dict[str, Any] = {}  # kind -> persistence target (set by the service)
        self._ended: deque[str] = deque()  # finished jobs of ``live``, oldest first
        # Clear while the unfinished jobs of the metadb are being resumed (after a restart
        # or on taking the lead): a long-poll or cancel of such a job waits for it.
        self.resumed = asyncio.Event()
        self.resumed.set()
        # canonical graph hash -> (canonical graph, fetched name -> plan node, fetch list) of
        # the structures submitted lately, for submit_bound (an LRU as long as the plan cache)
        self.structures: OrderedDict[str, Structure] = OrderedDict()

    # --- submit ----------------------------------------------------------------------------

    async def submit(self, graph_doc: Any, fetch: Any, deadline_s: float | None = None, *,
                     owner: str | None = None, grad: GradRequest | None = None,
                     persist: str | None = None, prefer: str | None = None) -> dict[str, Any]:
        """Validate, compile, store and dispatch a job; its status body (see the module doc)
        with ``plan`` (the canonical graph's hash) and ``args`` (the uploads bound to
        ``arg0, arg1, ...``), for :meth:`submit_bound` to run the same structure again.
        ``deadline_s``: the job fails (kind "deadline") if not ended that long after submit;
        ``owner``: the name of the token that submitted it (a submit token sees only its own);
        ``grad``: (of, wrt), gradients appended as nodes ``grad:<w>`` (``compile``);
        ``prefer``: an executor's name (:func:`prefer_node`)."""
        await self.require_leader()
        if not isinstance(fetch, list) or len(fetch) > MAX_FETCH or not all(type(f) is str for f in fetch):
            raise BadRequest(f"'fetch' must be a list of at most {MAX_FETCH} node ids")
        if persist is not None and persist not in self.persist:
            raise BadRequest(f"'persist': {persist!r} names no persistence target of this cluster "
                             f"(configured: {sorted(self.persist) or 'none'}; set $TRIPLANE_PERSIST_TO "
                             "on the scheduler and executors, e.g. file:/shared/dir)")
        cluster, engines, factors = await self.cluster.snapshot()
        held = await self.refs.resolve(refs_in_graph(graph_doc))
        locs: dict[str, str] = {}
        try:
            def compile_now() -> JobPlan:
                return self.compile(graph_doc, fetch, Refs.snapshot(cluster, held), held.bind,
                                    grad=grad, bound=self._bound_types(held), locs=locs)

            plan = prefer_node(await self._with_refs(await asyncio.to_thread(compile_now), held, owner,
                                                     compile_now), prefer)
            assert plan.graph is not None
            key = plan.graph.hash()  # computed (and kept on the graph) by the plan cache already
            self.structures[key] = (plan.graph, dict(plan.fetch), tuple(fetch), locs)
            self.structures.move_to_end(key)
            while len(self.structures) > self.plans.capacity:
                self.structures.popitem(last=False)
            body = await self._start(plan, fetch, deadline_s, owner, engines, factors, held, persist, locs)
        except BaseException:
            self.refs.drop(held)
            raise
        given = {r.tile: ref for ref, r in held.refs.items()}  # a ref is answered as given
        return {**body, "plan": key, "args": [given.get(a, a) for a in plan.args]}

    async def _with_refs(self, plan: JobPlan, held: Held, owner: str | None,
                         compile_again: Callable[[], JobPlan]) -> JobPlan:
        """``plan`` checked against its refs' types, compiled again if it reads a ref by
        regions (bound to a copy then, ``refs.py``), its tasks preferring the refs' holders."""
        if not held.refs:
            return plan
        Refs.check_types(plan, held)
        plan, copy = Refs.bind_regions(plan, held)
        if copy:
            await self.refs.copy_into(held, copy, owner)
            plan, _ = Refs.bind_regions(await asyncio.to_thread(compile_again), held)
        return Refs.prefer_holders(plan, held)

    async def submit_bound(self, plan_hash: str, args: list[str], fetch: list[str],
                           deadline_s: float | None = None, prefer: str | None = None,
                           await_refs_s: float = 0.0, *, owner: str | None = None,
                           step: bool = True) -> dict[str, Any]:
        """A job of a structure submitted before: its canonical graph (known by ``plan_hash``)
        with the uploads ``args`` bound to ``arg0, arg1, ...`` and the same ``fetch`` list.
        ``step`` (a compiled step): its rows may trail the answer by a journal batch; a retry's
        are stored first. ``await_refs_s``: a ref to a running job waits for it (``Refs.resolve``).
        Skips parsing, canonicalising, hashing and the passes (the plan cache holds the
        plan); laid out, stored and dispatched as :meth:`submit`. ``Conflict`` of kind
        ``unknown_plan`` when this process does not know the structure (never submitted,
        evicted, or a restart): the client sends the graph instead."""
        await self.require_leader()
        known = self.structures.get(plan_hash)
        if known is None or known[2] != tuple(fetch):
            raise Conflict(f"unknown plan {plan_hash[:16]!r} for this fetch list: submit the graph",
                           kind="unknown_plan")
        cgraph, fetch_map, _, locs = known
        nargs = sum(1 for n in cgraph.nodes.values() if n.op == "input")
        if len(args) != nargs:
            raise BadRequest(f"plan {plan_hash[:16]} binds {nargs} inputs, the request gives {len(args)}")
        cluster, engines, factors = await self.cluster.snapshot()
        held = await self.refs.resolve(refs_in_args(args), wait_s=await_refs_s)
        try:
            def compile_now() -> JobPlan:
                bind = held.bind
                return compile_job(cgraph, fetch_map, Refs.snapshot(cluster, held), cache=self.plans,
                                   args=[bind.get(a, a) for a in args], group=self.group)

            # A small structure whose plan is cached lays out in a fraction of a millisecond:
            # on the loop, without the worker-thread hop that cost more under load.
            if len(cgraph.nodes) <= INLINE_COMPILE_NODES and self.plans.holds(cgraph, CompileOptions()):
                plan = compile_now()
            else:
                plan = await asyncio.to_thread(compile_now)
            plan = prefer_node(await self._with_refs(plan, held, owner, compile_now), prefer)
            return await self._start(plan, fetch, deadline_s, owner, engines, factors, held, locs=locs,
                                     step=step)
        except BaseException:
            self.refs.drop(held)
            raise

    async def _start(self, plan: JobPlan, fetch: list[str], deadline_s: float | None, owner: str | None,
                     engines: Any, factors: Factors, held: Held,
                     persist: str | None = None, locs: Mapping[str, str] | None = None,
                     step: bool = False) -> dict[str, Any]:
        """Check, store and dispatch a compiled job; its status body. ``step``: a compiled
        step (``submit_bound``), whose rows may trail its answer by a batch of the journal."""
        bindings = bindings_of(plan)
        if held.refs:  # a resumed job finds them again (once their holders are back)
            bindings["refs"] = self.refs.recorded(held)
            bindings["ref_nodes"] = sorted({h for r in held.refs.values() for _, h in r.held()})
            cuts = Refs.held_cuts(plan.args, held)
            if cuts:  # tiled knowing its refs' tiles: planned again the same way (earlier.py)
                bindings["held"] = cuts
        if deadline_s is not None:
            bindings["deadline_s"] = deadline_s  # a resumed job keeps its deadline
        if persist is not None:
            bindings["persist"] = persist  # and its persistence
        if len(json.dumps(bindings)) > 60_000:
            raise LimitError(f"{len(plan.args)} uploaded inputs and {len(fetch)} fetched names "
                             "do not fit one job's record; submit fewer at once")
        self._check_uploads(plan, held)
        if plan.specs:
            if not self.shell.nodes and not engines:
                raise Unavailable("no executor is registered")
            missing = unsupported_op(plan.ops, (e.ops for e in engines))
            if missing is not None:
                nid = plan.node_with_op(missing) or missing
                raise UnknownOpError(f"no registered executor engine supports op {missing!r}",
                                     node=plan.back.get(nid, nid), op=missing)
        now = time.time()
        if len(plan.specs) <= STORE_FIRST_TASKS and not plan.group:
            # A job of few tasks is stored first (milliseconds): its tasks are big, and a
            # store running beside them would take CPU and the GIL from the replies when
            # the executors fill every core (the MLP step: 30-80 ms between a task's reply
            # and its successor's start early in the job, 1 ms once the store was done).
            # A grouped job is one task with no successor: it runs while it is stored.
            try:
                await asyncio.to_thread(self.store_job, plan, fetch, bindings, now, owner)
            except Exception as e:
                raise store_failed(plan.job, e) from None
            self.refs.bind(plan.job, held)
            return self.body(plan.job, self._dispatch(plan, now, (), factors, deadline_s, owner=owner,
                                                      persist=persist, locs=locs))
        # Dispatch first and store meanwhile: the executors start while ~10^4 task rows are
        # inserted. The journal holds the job's writes back until its rows exist.
        self.journal.hold(plan.job)
        self.refs.bind(plan.job, held)
        live = self._dispatch(plan, now, (), factors, deadline_s, owner=owner, persist=persist, locs=locs)
        try:
            if step and plan.group and len(plan.specs) <= INLINE_STORE_TASKS and is_small(plan):
                # A compiled step is a few rows: queued to the journal's batch writer, which
                # inserts them with its next batch (one transaction for many steps, before
                # their transitions). A transaction of its own per step, or two worker-thread
                # hops, cost more than the rest of the step's storing.
                self.journal.new_job(small_job_rows(plan, fetch, bindings, now, owner))
            elif plan.group and len(plan.specs) <= INLINE_STORE_TASKS:
                # Another grouped job is stored on the loop while its one task runs (its row
                # exists once the submit is answered: labels, listings).
                self.store_job(plan, fetch, bindings, now, owner)
            else:
                await asyncio.to_thread(self.store_job, plan, fetch, bindings, now, owner)
        except Exception as e:
            self.shell.handle(CancelJob(f"store-failed:{plan.job}", plan.job, time.time()))
            self.live.pop(plan.job, None)
            self.journal.forget(plan.job)
            raise store_failed(plan.job, e) from None
        finally:
            self.journal.release(plan.job)
        return self.body(plan.job, live)

    def compile(self, graph_doc: Any, fetch: list[str], cluster: ClusterSnapshot,
                bind: dict[str, str] | None = None, *, grad: GradRequest | None = None,
                bound: BoundTypes | None = None, locs: dict[str, str] | None = None) -> JobPlan:
        """Parse and compile a submitted graph (CPU-bound: a worker thread, so that the
        event loop keeps answering replies, health checks and the registry's keep-alives);
        ``bind``: its refs -> what they resolved to. Types the document leaves out are
        inferred (``proto/infer.py``; ``bound`` types the inputs from their uploads and
        refs), and ``grad`` = (of, wrt) appends the gradients (``proto/autograd.py``).
        ``locs`` is filled with the nodes' source lines (``loc``) the document carries."""
        graph = graph_from_wire(graph_doc, bound=bound, locs=locs)
        if grad is not None:
            graph, _ = named_gradients(graph, *grad)
        return compile_job(graph, fetch, cluster, cache=self.plans, bind=bind, group=self.group)

    def _bound_types(self, held: Held) -> BoundTypes:
        """The type of an upload or a resolved ref, for an input node that gives none."""
        def bound(tensor: str) -> TensorType | None:
            r = held.refs.get(tensor)
            stored = self.store.get(tensor) if r is None else None
            found = r if r is not None else stored
            return type_of(found.shape, found.dtype) if found is not None else None

        return bound

    def _check_uploads(self, plan: JobPlan, held: Held) -> None:
        tiles = held.by_tile() if held.refs else {}
        for nid, tensor in plan.uploads.items():
            if tensor in tiles:
                continue  # a ref's tile: resolved and type-checked already
            stored = self.store.get(tensor)
            node = plan.plan.graph.nodes[nid]
            name = plan.back.get(nid, nid)
            if stored is None:
                raise GraphError(f"unknown uploaded tensor {tensor!r}", node=name, op="input")
            if stored.shape != tuple(node.shape) or stored.dtype != node.dtype:
                raise GraphError(f"uploaded tensor {tensor} is {stored.dtype}{list(stored.shape)}, "
                                 f"the graph declares {node.dtype}{list(node.shape)}", node=name, op="input")

    def store_job(self, plan: JobPlan, fetch: list[str], bindings: dict[str, Any], now: float,
                  owner: str | None = None) -> None:
        """Store the job's rows (``jobrecords.store_job``; blocking: a worker thread, or the
        loop for a grouped job's few rows)."""
        store_job(self.db, plan, fetch, bindings, now, owner)
        self.journal.stored(plan.job, [t.id for t in plan.specs])

    def _dispatch(self, plan: JobPlan, created: float, done: tuple[tuple[str, str], ...],
                  factors: Factors | None = None, deadline_s: float | None = None, *,
                  owner: str | None = None, resumed: bool = False, persist: str | None = None,
                  attempts: tuple[tuple[str, int], ...] = (),
                  locs: Mapping[str, str] | None = None) -> LiveJob:
        live = LiveJob(plan, dict(plan.back), created, time.time(), factors=factors,
                       recomputing=bool(attempts), locs=locs or {})
        self.journal.job_started(plan.job, owner, len(plan.specs), len(done), resumed=resumed)
        live.fetched_tasks = frozenset(fetched_tasks_of(plan))
        self.live[plan.job] = live
        self.templates[plan.job] = dict(plan.templates)
        deadline = None if deadline_s is None else created + deadline_s
        why = "recompute" if attempts else "submit"
        self.shell.handle(SubmitJob(f"{why}:{plan.job}", plan.job, plan.specs, time.time(), done, deadline,
                                    persist, attempts))
        return live

    def recompute(self, plan: JobPlan, created: float, done: tuple[tuple[str, str], ...],
                  attempts: tuple[tuple[str, int], ...], owner: str | None) -> LiveJob:
        """Dispatch a done job again to run the tasks ``attempts`` names (with those attempt
        numbers), the others ``done`` where they are (lineage.py). It stays done; its end
        sets ``holders`` again, and ``recompute_error`` if those tasks could not run."""
        return self._dispatch(plan, created, done, owner=owner, resumed=True, attempts=attempts)

    # --- resume ------------------------------------------------------------------------------

    def load_resumable(self) -> list[Resumable]:
        """The unfinished jobs of the metadb this process does not run (blocking)."""
        out = []
        with self.db.read() as s:
            for r in mdb.jobs_to_resume(s):
                if r.job.id in self.live:
                    continue
                g = Graph.from_json(mdb.get_graph(s, r.job.graph_hash).canonical)
                ev = mdb.list_events(s, r.job.id, limit=1)
                bindings = ev[0].payload if ev and ev[0].kind == BINDINGS else {}
                out.append((r.job, g, bindings, r.tasks))
        return out

    async def resume(self, resumable: list[Resumable], live_nodes: set[str]) -> None:
        """Dispatch ``resumable`` again: a task whose row says done on one of ``live_nodes``
        stays done (its output tile is there), the rest run again."""
        for info, cgraph, bindings, tasks in resumable:
            if info.id in self.live:
                continue
            try:
                plan = await asyncio.to_thread(plan_again, info.id, cgraph, bindings, self.plans)
            except REBUILD_ERRORS as e:  # not a graph we accepted
                await asyncio.to_thread(self._set_failed, info.id, f"cannot resume: {e}")
                continue
            gone = sorted(u for u in plan.uploads.values() if is_tensor_id(u) and self.store.get(u) is None)
            if gone:  # a compiled step's inline inputs lived in the last process's memory only
                await asyncio.to_thread(self._set_failed, info.id, f"cannot resume: its input {gone[0]} "
                                        "is gone (a compiled step's inline input, held in the "
                                        "scheduler's memory only, or an upload released since)")
                continue
            try:
                held = await self.refs.reattach(bindings.get("refs") or {})
            except Exception as e:  # a ref's value is gone (its job released, its holder down)
                await asyncio.to_thread(self._set_failed, info.id, f"cannot resume: {e}")
                continue
            done = tuple((t.task_id, t.node) for t in tasks
                         if t.state == "done" and t.node in live_nodes and t.task_id in plan.templates)
            deadline_s = bindings.get("deadline_s")  # from submit's time, as the first process had it
            if type(deadline_s) not in (int, float):
                deadline_s = None
            persist = bindings.get("persist")
            self.refs.bind(info.id, held)
            self._dispatch(plan, info.created_at, done, None, deadline_s, owner=info.owner, resumed=True,
                           persist=persist if persist in self.persist else None)
            log.info("resumed job %s (%d of %d tasks already done)", info.id, len(done), len(plan.specs))

    def _set_failed(self, job: str, error: str) -> None:
        with self.db.transaction() as s:
            mdb.set_job_state(s, job, "failed", error=error)

    # --- status, list, wait, cancel -----------------------------------------------------------

    def status(self, job: str) -> dict[str, Any]:
        """The job's status body; NotFound for an unknown job."""
        live = self.live.get(job)
        if live is not None:
            return self.body(job, live)
        try:
            with self.db.read() as s:
                info = mdb.get_job(s, job)
                failed = mdb.list_events(s, job, limit=1, kind=FAILED) if info.error else []
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            raise NotFound(f"unknown job {job!r}") from None
        if failed and isinstance(failed[0].payload, dict):
            error: dict[str, Any] | None = failed[0].payload  # as the job's status said while in memory
        elif info.error:
            error = {"kind": "infra", "message": info.error, "node": None, "op": None}
        else:
            error = None
        return stored_body(info, error)

    def body(self, job: str, live: LiveJob) -> dict[str, Any]:
        js = self.shell.state.jobs.get(job)
        total = len(live.plan.specs)
        done = total - js.remaining if js is not None else live.done
        if live.recomputing:  # lost tiles of a done job run again (lineage.py): it is done
            done = total
        return {
            "id": job,
            "state": "done" if live.recomputing else live.state,
            "progress": {"done": done, "total": total},
            "error": live.error,
            "created": live.created,
            "updated": live.updated,
        }

    def list(self, limit: int = 50, *, owner: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` jobs (of ``owner`` only, when given)."""
        with self.db.read() as s:
            infos = mdb.list_jobs(s, limit=limit, owner=owner)
        return [self.body(i.id, self.live[i.id]) if i.id in self.live else stored_body(i, i.error)
                for i in infos]

    async def wait(self, job: str, timeout: float) -> dict[str, Any]:
        """The status body once the job ends or ``timeout`` seconds pass."""
        if job not in self.live and not self.resumed.is_set():
            started = time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.resumed.wait(), max(0.0, timeout))
            timeout -= time.monotonic() - started
        live = self.live.get(job)
        if live is not None and live.state == "running" and not live.recomputing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(live.ended.wait(), max(0.0, timeout))
        return self.status(job)

    async def cancel(self, job: str) -> dict[str, Any]:
        """Cancel a running job and release its tiles (a finished job's too)."""
        await self.require_leader()
        if job not in self.live and not self.resumed.is_set():
            await self.resumed.wait()  # it may be one being resumed
        live = self.live.get(job)
        if live is None:
            body = self.status(job)  # NotFound for an unknown job
            if body["state"] == "done":  # run by an earlier process or dropped: its tiles are held
                await self.results.release_earlier(job)
            return body
        if live.state == "running":
            self.shell.handle(CancelJob(f"cancel:{job}", job, time.time()))
        released = live.fetched_released
        await self.results.release(job, live, keep_fetched=False)
        if not released:
            await self.results.record_released(job)
        return self.body(job, live)

    # --- hooks from the dispatcher (event loop; never block) ----------------------------------

    def finished(self, f: JobFinished) -> None:
        live = self.live.get(f.job)
        js = self.shell.state.jobs.get(f.job)
        if live is None or js is None:
            return
        live.state = f.state
        live.updated = time.time()
        if f.state == "failed":
            live.error = self._failure(live, f)
            failed = next((tid for tid, t in js.tasks.items() if t.state == "failed"), None)
            if failed is not None and f.error is not None:  # the row of the task that failed it
                live.error["task"] = failed
                self.journal.task_failed(f.job, failed, f.error.kind, f.error.message)
            ref = self.refs.ref_of(f.job, f.error.input) if f.error is not None and f.error.input else None
            if ref is not None and f.error is not None and f.error.kind == "infra":  # its holder is gone
                live.error = {**live.error, "kind": "lost", "ref": ref}
        elif f.state == "cancelled" and live.failure is not None:  # failed from outside (a lost ref)
            live.state, live.error = "failed", live.failure
        if live.recomputing:  # what it had stays the job's: only the tiles run again stay lost
            live.recomputing = False
            live.recompute_error = live.error if live.state != "done" else None
            live.state, live.error = "done", None
        live.holders = {tid: t.node for tid, t in js.tasks.items() if t.node}
        live.retried = any(t.attempt for t in js.tasks.values())
        live.done = len(js.tasks) - (js.remaining if live.recompute_error is None else 0)
        self.journal.job_ended(f.job, live.state, live.done, live.error["message"] if live.error else None,
                               live.error, total=len(js.tasks), duration_s=live.updated - live.created)
        # The dispatcher is done with the job: what outlives it is on ``live``.
        del self.shell.state.jobs[f.job]
        self.templates.pop(f.job, None)
        self.refs.ended(f.job)
        live.ended.set()
        asyncio.get_running_loop().create_task(self.results.release(f.job, live, keep_fetched=True))
        self._ended.append(f.job)
        self._drop_old()

    def _drop_old(self) -> None:
        """Keep the ``retain`` most recent finished jobs in memory, and those that ended less
        than ``RETAIN_MIN_S`` ago; the metadb has the rest."""
        old = time.time() - RETAIN_MIN_S
        while len(self._ended) > self.retain:
            live = self.live.get(self._ended[0])
            if live is not None and live.state != "running" and live.updated > old:
                return  # the oldest ended too recently, and every later one after it
            job = self._ended.popleft()
            if live is not None and live.state != "running":
                del self.live[job]

    def forget_unfinished(self) -> None:
        """Drop the jobs still running (a scheduler stepping down: the next leader resumes
        them); the finished ones stay, their results are still fetchable."""
        for job in [j for j, live in self.live.items() if live.state == "running"]:
            del self.live[job]
            self.refs.ended(job)
        self.templates.clear()

    @staticmethod
    def _failure(live: LiveJob, f: JobFinished) -> dict[str, Any]:
        e = f.error  # structured by the dispatcher (TaskFailure): no parsing of messages
        if e is None:
            return {"kind": "infra", "message": "failed", "node": None, "op": None}
        node = live.name_of(e.task) if e.task is not None else None
        op = e.op
        if op == GROUP_OP and e.task is not None:  # the node inside a grouped task that failed
            inner = live.plan.plan.graph.nodes.get(e.task)
            op = inner.op if inner is not None else op
        return {"kind": e.kind, "message": e.message, "node": node, "op": op,
                **({"loc": live.locs[node]} if node in live.locs else {})}

    def locate(self, job: str, task: str) -> tuple[str | None, str | None]:
        """(the submitted node ``task`` came from, that node's ``loc``) while this process
        holds ``job`` (the task that failed it: the node its error names, inside a grouped
        task); (None, None) otherwise."""
        live = self.live.get(job)
        if live is None:
            return None, None
        if live.error is not None and live.error.get("task") == task:
            return live.error.get("node"), live.error.get("loc")
        node = live.name_of(task)
        return node, live.locs.get(node)

    def progress(self, job: str) -> tuple[bool, int, int]:
        js = self.shell.state.jobs.get(job)
        return (False, 0, 0) if js is None else (js.state == "running", len(js.tasks) - js.remaining,
                                                 len(js.tasks))

    def output(self, job: str, task: str, node: str, r: Reply) -> None:
        tpl = self.templates.get(job, {}).get(task)
        if tpl is not None:
            self.cluster.ran(node, tpl.uploads)
        live = self.live.get(job)
        if live is not None:
            live.actual[task] = (r.timings.start, r.timings.end)
            if r.data:
                live.carried.update(r.data)
            if live.factors is not None:
                kernel_s = r.timings.end - r.timings.start
                self.cluster.calibrate(live.plan.layout, live.factors, task, node, kernel_s)
        # The kernel's times ride on the task's done row update (so a later process can show
        # them in the job's plan). Only the results a client will read get a tiles row: every
        # other output's location is its task row (done, node), written anyway -- 10^4 tile
        # rows per job cost the scheduler more CPU than the tasks themselves (docs/scheduler.md).
        self.journal.output(job, task, node, r, tiles=live is None or task in live.fetched_tasks)
