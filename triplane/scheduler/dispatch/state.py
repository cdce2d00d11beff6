"""The dispatcher's core: a pure state machine over jobs and their tasks.

Events go in (``handle(event) -> list[Instruction]``); instructions come out for the I/O
shell to carry out (send a packet, finish a job, persist transitions). Nothing here does
I/O or reads a clock: time arrives in events. So every rule below is tested without a
socket. The events and instructions are in ``events.py``, the records, knobs and the
transition table in ``records.py``; this module holds the rules.

Task states (``triplane.proto.states.TaskState``) and the transitions allowed between them
(``TRANSITIONS``)::

    pending --deps done--> ready --placed--> dispatched --reply ok--> done
       ^                    ^                    |
       |                    +---- drift ---------+   (no reply after retries, ran past its
       |                    |                    |    run deadline, node lost, infra error)
       +-- lineage ---------+-- (done, output lost with its node, still needed)
    any non-terminal --user error / attempts exhausted / job deadline--> failed
    any non-terminal --cancel--> cancelled

Order: ready tasks are placed by (job submitted first, the task's ``priority``, became
ready first). A placed job's priority is each task's predicted start in its plan, so a
node runs its tasks in the order the plan was predicted with: a task on the critical
path that becomes ready late is not queued behind work the plan put after it. Unplaced
jobs (priority 0) go first come, first served.

Early sends: a task placed on node N whose unfinished inputs are all dispatched to N is
made ready then, not when they finish (``eager``): the executor receives it behind them and
starts it the moment its inputs are made there, without a round trip through the scheduler
per dependency. Its packet names N as the source of those inputs, which tells the executor
to wait for them. If such an input's task drifts away from N, the early task is recalled
(drifts too); its attempt on N is dropped by the executor when the input fails there or
does not appear.

Deadlines: an attempt has a resend time (pushed back by every ack: the executor has it)
and a run deadline (``Policy.run_budget`` after its dispatch, which no ack moves; the first
report of its kernel's start moves it once, to start + budget). Past its run deadline
an attempt drifts to another node even while its executor keeps acknowledging, and the
next attempt's budget doubles. A job's own deadline (``SubmitJob.deadline``) fails it
with kind ``deadline`` on the first tick after it.

Intermediates (``Policy.free_intermediates``): when a task is done, each output it read
whose readers are now all done, and its own output if nothing reads it, is freed -- a
``Free`` instruction to delete the tile on its node -- unless the user fetches it
(``TaskSpec.is_output``; uploads are no tasks and never freed). A freed task stays done
with no node, so it is not *available*: if a reader must run again (its own output lost
with its node, or a drift), the freed input is recomputed from lineage, as a lost one. So
is an input its holder reports it does not have when a reader runs there (``TaskErred``
naming the input on that node: e.g. a resumed job whose tile was freed before the restart).

Delivery: a task may run more than once (retransmits reuse the attempt number, drifts take
the next one); only the first reply of the current attempt counts, later or stale ones
are ignored, so each result is recorded once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from triplane.engines.memory.persist import STORE_PREFIX
from triplane.proto.states import TaskState
from triplane.scheduler.dispatch.events import (
    CancelJob,
    Event,
    Free,
    Instruction,
    JobFinished,
    NodeDown,
    NodeUp,
    Send,
    SubmitJob,
    TaskAcked,
    TaskErred,
    TaskFailure,
    TaskSpec,
    TaskSucceeded,
    Tick,
    Transitioned,
)
from triplane.scheduler.dispatch.records import (
    TERMINAL,
    TRANSITIONS,
    InvalidTransition,
    JobRecord,
    NodeRecord,
    Policy,
    TaskRecord,
)

__all__ = [
    "TERMINAL", "TRANSITIONS", "CancelJob", "DispatchState", "Event", "Free", "Instruction",
    "InvalidTransition", "JobFinished", "JobRecord", "NodeDown", "NodeRecord", "NodeUp",
    "Placer", "Policy", "Send", "SubmitJob", "TaskAcked", "TaskErred", "TaskFailure",
    "TaskRecord", "TaskSpec", "TaskSucceeded", "Tick", "Transitioned", "place_near_inputs",
]

PENDING, READY, DISPATCHED = TaskState.PENDING, TaskState.READY, TaskState.DISPATCHED
DONE, FAILED, CANCELLED = TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED

Placer = Callable[[TaskRecord, Sequence[NodeRecord], "DispatchState"], NodeRecord | None]


class DispatchState:
    """All jobs, tasks and nodes the dispatcher knows, and the rules that move them."""

    def __init__(self, policy: Policy | None = None, placer: Placer | None = None) -> None:
        self.policy = policy or Policy()
        self.placer = placer or place_near_inputs
        self.jobs: dict[str, JobRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.drained: frozenset[str] = frozenset()  # nodes an admin drained: nothing new goes there
        # (job seq, priority, ready seq, job, task) of the tasks awaiting a node: a heap
        self._ready: list[tuple[int, float, int, str, str]] = []
        self._seq = 0  # tie-breaker: first ready, first placed
        self._jobs_seen = 0
        self._job_deadlines: list[tuple[float, str]] = []  # (deadline, job): a heap

    # --- entry point ---------------------------------------------------------------------

    def handle(self, event: Event) -> list[Instruction]:
        out: list[Instruction] = []
        handler = _HANDLERS[type(event)]
        handler(self, event, out)
        self._schedule(event, out)
        return out

    # --- handlers ------------------------------------------------------------------------

    def _on_submit(self, ev: SubmitJob, out: list[Instruction]) -> None:
        if ev.job in self.jobs:
            raise ValueError(f"job {ev.job!r} was already submitted")
        tasks = {t.id: TaskRecord(ev.job, t) for t in ev.tasks}
        for t in tasks.values():
            for d in t.spec.deps:
                if d not in tasks:
                    raise ValueError(f"task {t.spec.id!r} depends on unknown task {d!r}")
                tasks[d].dependents.add(t.spec.id)
            t.waiting_on = set(t.spec.deps)
        self._jobs_seen += 1
        job = JobRecord(ev.job, tasks, remaining=len(tasks), seq=self._jobs_seen,
                        deadline=ev.deadline, submitted=ev.now, persist=ev.persist)
        if ev.deadline is not None:
            heapq.heappush(self._job_deadlines, (ev.deadline, ev.job))
        for task_id, attempt in ev.attempts:
            tasks[task_id].attempt = attempt
        for task_id, node in ev.done:
            t = tasks[task_id]  # KeyError for an unknown task: a caller bug
            t.state, t.node = DONE, node
            job.remaining -= 1
        for t in tasks.values():
            if t.state == DONE:
                for d in t.dependents:
                    tasks[d].waiting_on.discard(t.spec.id)
        self.jobs[ev.job] = job
        for t in tasks.values():
            if t.state != PENDING:
                continue
            if not t.waiting_on:
                self._move(t, READY, ev.stimulus_id, ev.now, out)
        if job.remaining == 0:
            self._finish_job(job, "done", None, out)

    def _on_success(self, ev: TaskSucceeded, out: list[Instruction]) -> None:
        t = self._current(ev.job, ev.task, ev.attempt)
        if t is None or t.state != DISPATCHED:
            return  # a duplicate or stale reply: the result is recorded once
        self._release_slot(t)
        t.node = ev.node
        self._move(t, DONE, ev.stimulus_id, ev.now, out)
        job = self.jobs[ev.job]
        job.remaining -= 1
        for d in t.dependents:
            dep = job.tasks[d]
            dep.waiting_on.discard(t.spec.id)
            if dep.state == PENDING and (not dep.waiting_on or self._early(job, dep)):
                self._move(dep, READY, ev.stimulus_id, ev.now, out)
        if self.policy.free_intermediates:
            self._free_read(job, t, out)
        if job.remaining == 0 and job.state == "running":
            self._finish_job(job, "done", None, out)

    def _on_error(self, ev: TaskErred, out: list[Instruction]) -> None:
        t = self._current(ev.job, ev.task, ev.attempt)
        if t is None or t.state != DISPATCHED:
            return
        self._release_slot(t)
        if ev.kind == "user":
            t.error = TaskFailure("user", ev.message, ev.at or t.spec.id, t.spec.op, ev.node, ev.input,
                                  t.attempt + 1)
            self._move(t, FAILED, ev.stimulus_id, ev.now, out)
            self._fail_job(self.jobs[ev.job], t.error, ev.stimulus_id, ev.now, out)
        else:
            job = self.jobs[ev.job]
            gone = next((job.tasks[d] for d in t.spec.deps if ev.input == f"{job.id}.{d}"), None)
            if (gone is not None and ev.input_node == ev.node and gone.node == ev.node
                    and gone.state == DONE):
                # The node says it does not hold an input we think it holds (freed before a
                # scheduler restart, evicted, its executor restarted): lineage, not its fault.
                self._lost_output(job, gone, ev.stimulus_id, ev.now, out)
            else:
                t.excluded.add(ev.node)
            self._drift(t, f"infra error on {ev.node}: {ev.message}", ev.stimulus_id, ev.now, out,
                        node=ev.input_node or ev.node, input=ev.input)

    def _on_ack(self, ev: TaskAcked, out: list[Instruction]) -> None:
        t = self._current(ev.job, ev.task, ev.attempt)
        if t is None or t.state != DISPATCHED:
            return
        # Delivered: a resend now would only be dropped as a duplicate. Wait for the run
        # time instead; a resend after that fetches a lost reply from the executor's cache
        # (or another ack, with the kernel's start once it runs). An executor that acks is
        # alive: a slow or queued task is not retransmitted into drifting. But no ack moves
        # the run deadline (``due``): a kernel hung on a live executor drifts when it passes.
        t.resend_at = max(t.resend_at, ev.now + self.policy.resend_timeout(t.spec))
        t.sends = 1
        if ev.since is not None and not t.started:
            # Its kernel started: its budget counts from then (queued time is not its own),
            # once -- a start is not reported later than now, so this cannot run away.
            t.started = True
            start = min(ev.since, ev.now)
            t.due = max(t.due, start + self.policy.run_budget(t.spec, t.overruns))

    def _on_tick(self, ev: Tick, out: list[Instruction]) -> None:
        now = ev.now
        while self._job_deadlines and self._job_deadlines[0][0] <= now:
            deadline, job_id = heapq.heappop(self._job_deadlines)
            job = self.jobs.get(job_id)
            if job is not None and job.state == "running":
                done = len(job.tasks) - job.remaining
                self._fail_job(job, TaskFailure(
                    "deadline", f"job {job_id} passed its deadline ({deadline - job.submitted:.3g} s "
                    f"after submit) with {done} of {len(job.tasks)} tasks done"),
                    ev.stimulus_id, now, out)
        # Only dispatched tasks have deadlines, and each sits in its node's ``running`` set:
        # walking those keeps a tick O(in flight), not O(every task of every job).
        jobs = self.jobs
        due = sorted(key for n in self.nodes.values() for key in n.running
                     if now >= (r := jobs[key[0]].tasks[key[1]]).resend_at or now >= r.due)
        for job_id, task_id in due:
            job = self.jobs[job_id]
            t = job.tasks[task_id]
            if job.state != "running" or t.state != DISPATCHED:
                continue
            assert t.node is not None
            if now >= t.due:
                # Ran past its run deadline, acknowledged or not (a hung kernel): elsewhere,
                # with twice the budget (a task the cost model got wrong still finishes).
                budget = self.policy.run_budget(t.spec, t.overruns)
                self._release_slot(t)
                t.excluded.add(t.node)
                t.overruns += 1
                self._drift(t, f"no result from {t.node} within its run deadline ({budget:.3g} s; "
                               f"predicted {t.spec.cost_s:.3g} s)", ev.stimulus_id, now, out,
                            node=t.node)
            elif t.sends < self.policy.max_sends:
                # Lost packet or reply: retransmit with the same attempt id.
                t.sends += 1
                t.resend_at = now + self.policy.resend_timeout(t.spec)
                out.append(Send(job.id, t.spec.id, t.attempt, t.node, t.due,
                                self._pull_from(t), resend=True))
            else:
                self._release_slot(t)
                t.excluded.add(t.node)
                self._drift(t, f"no reply from {t.node} after {t.sends} sends",
                            ev.stimulus_id, now, out, node=t.node)

    def _on_node_up(self, ev: NodeUp, out: list[Instruction]) -> None:
        n = self.nodes.get(ev.node)
        if n is None:
            self.nodes[ev.node] = NodeRecord(ev.node, ev.slots)
        else:
            n.alive, n.slots = True, ev.slots

    def _on_node_down(self, ev: NodeDown, out: list[Instruction]) -> None:
        n = self.nodes.get(ev.node)
        if n is None or not n.alive:
            return
        n.alive = False
        for job in self.jobs.values():
            if job.state != "running":
                continue
            for t in job.tasks.values():
                if t.node != ev.node:
                    continue
                if t.state == DISPATCHED:
                    self._release_slot(t)
                    t.excluded.add(ev.node)
                    self._drift(t, f"node {ev.node} lost", ev.stimulus_id, ev.now, out, node=ev.node)
                elif t.state == DONE and job.persist:
                    # Its output is kept by the persistence target too: readers read it there.
                    t.node = STORE_PREFIX + job.persist
                    out.append(Transitioned(job.id, t.spec.id, DONE, DONE, t.attempt, t.node,
                                            f"persisted:{ev.node}", ev.now))
                elif t.state == DONE:
                    self._lost_output(job, t, ev.stimulus_id, ev.now, out)

    def _on_cancel(self, ev: CancelJob, out: list[Instruction]) -> None:
        job = self.jobs.get(ev.job)
        if job is None or job.state != "running":
            return
        for t in job.tasks.values():
            if t.state not in TERMINAL:
                self._release_slot(t)
                self._move(t, CANCELLED, ev.stimulus_id, ev.now, out)
        self._finish_job(job, "cancelled", None, out)

    # --- rules -----------------------------------------------------------------------------

    def _drift(self, t: TaskRecord, why: str, stimulus_id: str, now: float,
               out: list[Instruction], *, node: str | None = None, input: str | None = None) -> None:
        """Re-run ``t`` elsewhere with the next attempt, or fail the job (kind ``infra``) if
        out of attempts. ``node``/``input``: what the failure is about (its TaskFailure)."""
        job = self.jobs[t.job]
        self._recall(job, t, stimulus_id, now, out)
        if t.attempt + 1 >= self.policy.max_attempts:
            t.error = TaskFailure("infra", f"{why}; gave up after {t.attempt + 1} attempts",
                                  t.spec.id, t.spec.op, node, input, t.attempt + 1)
            self._move(t, FAILED, stimulus_id, now, out)
            self._fail_job(job, t.error, stimulus_id, now, out)
            return
        t.attempt += 1
        t.node = None
        t.not_before = now + min(self.policy.retry_backoff_s * 2 ** (t.attempt - 1),
                                 self.policy.max_backoff_s)
        missing = {d for d in t.spec.deps if not self._available(job.tasks[d])}
        if missing:  # an input was lost too: wait for its recomputation
            t.waiting_on = missing
            self._move(t, PENDING, stimulus_id, now, out)
        else:
            self._move(t, READY, stimulus_id, now, out)

    def _free_read(self, job: JobRecord, t: TaskRecord, out: list[Instruction]) -> None:
        """``t`` is done: free each intermediate it read whose readers are now all done, and
        its own output if nothing reads it (module doc: Intermediates)."""
        tasks = job.tasks
        for d in (*t.spec.deps, t.spec.id):
            src = tasks[d]
            if (src.state == DONE and src.node is not None and not src.spec.is_output
                    and all(tasks[r].state == DONE for r in src.dependents)):
                out.append(Free(job.id, d, src.node))
                src.node = None  # not available any more: a reader run again recomputes it

    def _lost_output(self, job: JobRecord, t: TaskRecord, stimulus_id: str, now: float,
                     out: list[Instruction]) -> None:
        """A done task's output died with its node: recompute it if anyone still needs it
        (lineage), and likewise, recursively, its own inputs that died too."""
        needed = t.spec.is_output or any(job.tasks[d].state != DONE for d in t.dependents)
        if not needed:
            return
        t.node = None
        t.attempt += 1
        job.remaining += 1
        for d in t.dependents:
            dep = job.tasks[d]
            if dep.state in (PENDING, READY):
                dep.waiting_on.add(t.spec.id)
                if dep.state == READY:
                    self._unready(dep, stimulus_id, now, out)
        lost = [d for d in t.spec.deps if not self._available(job.tasks[d])]
        t.waiting_on = set(lost)
        self._move(t, PENDING if lost else READY, stimulus_id, now, out)
        for d in lost:
            if job.tasks[d].state == DONE:
                self._lost_output(job, job.tasks[d], stimulus_id, now, out)

    def _available(self, t: TaskRecord) -> bool:
        """Is ``t``'s output computed and held by a live node (or a persistence target)?"""
        n = self.nodes.get(t.node or "")
        return t.state == DONE and ((n is not None and n.alive) or (t.node or "").startswith(STORE_PREFIX))

    def _unready(self, t: TaskRecord, stimulus_id: str, now: float, out: list[Instruction]) -> None:
        self._ready = [e for e in self._ready if (e[3], e[4]) != (t.job, t.spec.id)]
        heapq.heapify(self._ready)
        self._move(t, PENDING, stimulus_id, now, out)

    def _schedule(self, ev: Event, out: list[Instruction]) -> None:
        """Place ready tasks on nodes with free slots, in queue order (module doc: Order).

        Stops as soon as no live node has a free slot, so an event costs O(tasks placed),
        not O(tasks ready): a job of 10,000 independent tasks must not rescan its whole
        queue on every reply."""
        now = getattr(ev, "now", 0.0)
        if not self._ready:
            return
        alive = [n for n in self.nodes.values() if n.alive and n.name not in self.drained]
        if not alive:
            return
        skipped: list[tuple[int, float, int, str, str]] = []  # ready, but not placeable now
        ready = self._ready
        policy = self.policy
        while ready:
            if all(len(n.running) >= max(n.slots, policy.small_slots) for n in alive):
                break
            entry = heapq.heappop(ready)
            key = (entry[3], entry[4])
            job = self.jobs.get(key[0])
            if job is None or job.state != "running":
                continue
            t = job.tasks[key[1]]
            if t.state != READY:
                continue
            if t.waiting_on and not self._early(job, t):
                # Made ready early, but an input has left this task's node since: wait for it.
                self._move(t, PENDING, ev.stimulus_id, now, out)
                continue
            if t.not_before > now:  # backing off after a failed attempt
                skipped.append(entry)
                continue
            spec = t.spec
            free = [n for n in alive if len(n.running) < policy.capacity(spec, n.slots)]
            if not free:
                # A task that does not fit waits at the head of the queue (the small ones
                # behind it too), so an event costs O(tasks placed).
                heapq.heappush(ready, entry)
                break
            chosen = self._preferred(t)
            if chosen is not None:
                # Placement's node: wait for its slot rather than run elsewhere (its memory
                # and the predicted times were planned for that node).
                if len(chosen.running) >= policy.capacity(spec, chosen.slots):
                    skipped.append(entry)
                    continue
                node: NodeRecord | None = chosen
            else:
                candidates = [n for n in free if n.name not in t.excluded]
                if not candidates and all(n.name in t.excluded for n in alive):
                    candidates = free  # every live node failed it once: better retry than hang
                node = self.placer(t, candidates, self) if candidates else None
            if node is None:
                skipped.append(entry)
                continue
            t.node = node.name
            t.sends = 1
            # Policy.resend_timeout and run_budget, inlined: this is the per-task hot path.
            predicted = policy.deadline_factor * spec.cost_s
            t.resend_at = now + (predicted if predicted > policy.min_timeout_s else policy.min_timeout_s)
            t.due = now + (policy.run_budget(spec, t.overruns) if t.overruns else
                           policy.run_slack_s + predicted)
            t.started = False
            node.running.add(key)
            self._move(t, DISPATCHED, ev.stimulus_id, now, out, queue=False)
            out.append(Send(t.job, spec.id, t.attempt, node.name, t.due, self._pull_from(t)))
            for d in t.dependents:  # queued behind it, they go now if early (module doc)
                dep = job.tasks[d]
                if dep.state == PENDING and self._early(job, dep):
                    self._move(dep, READY, ev.stimulus_id, now, out)
        for entry in skipped:
            heapq.heappush(ready, entry)

    # --- helpers -----------------------------------------------------------------------------

    def _preferred(self, t: TaskRecord) -> NodeRecord | None:
        """The task's placed node if it is alive and has not failed it; else None (the
        placer chooses: a dead or excluded node's tasks drift as usual)."""
        name = t.spec.node
        if name is None or name in t.excluded:
            return None
        n = self.nodes.get(name)
        return n if n is not None and n.alive and name not in self.drained else None

    def _early(self, job: JobRecord, t: TaskRecord) -> bool:
        """May waiting ``t`` be sent now, ahead of its unfinished inputs? Yes when the policy
        allows it and each of them is dispatched to ``t``'s placed node (module doc)."""
        if not self.policy.eager:
            return False
        home = self._preferred(t)
        if home is None:
            return False
        for d in t.waiting_on:
            dep = job.tasks[d]
            if dep.state != DISPATCHED or dep.node != home.name:
                return False
        return True

    def _recall(self, job: JobRecord, t: TaskRecord, stimulus_id: str, now: float,
                out: list[Instruction]) -> None:
        """``t`` leaves its node: drift the tasks sent there early to wait for its output."""
        if not t.node:
            return
        for d in t.dependents:
            dep = job.tasks[d]
            if dep.state == DISPATCHED and dep.node == t.node and t.spec.id in dep.waiting_on:
                self._release_slot(dep)
                self._drift(dep, f"its input {t.spec.id} left {t.node}", stimulus_id, now, out)

    def _pull_from(self, t: TaskRecord) -> tuple[tuple[str, str], ...]:
        """(input task, node holding it) of the inputs held elsewhere, and of those still
        being made on ``t``'s own node (an early send: the executor waits for them)."""
        job = self.jobs[t.job]
        return tuple((d, n) for d in t.spec.deps
                     if (n := job.tasks[d].node) and (n != t.node or d in t.waiting_on))

    def _current(self, job: str, task: str, attempt: int) -> TaskRecord | None:
        j = self.jobs.get(job)
        if j is None or j.state != "running":
            return None
        t = j.tasks.get(task)
        if t is None or t.attempt != attempt:
            return None
        return t

    def _release_slot(self, t: TaskRecord) -> None:
        if t.node and t.node in self.nodes:
            self.nodes[t.node].running.discard((t.job, t.spec.id))

    def _move(self, t: TaskRecord, finish: TaskState, stimulus_id: str, now: float,
              out: list[Instruction], queue: bool = True) -> None:
        start = t.state
        if (start, finish) not in TRANSITIONS:
            raise InvalidTransition(f"task {t.job}/{t.spec.id}: {start} -> {finish} is not allowed "
                                    f"(stimulus {stimulus_id})")
        t.state = finish
        rec = Transitioned(t.job, t.spec.id, start, finish, t.attempt, t.node, stimulus_id, now)
        t.log.append(rec)
        out.append(rec)
        if finish == READY and queue:
            self._seq += 1
            heapq.heappush(self._ready, (self.jobs[t.job].seq, t.spec.priority, self._seq, t.job, t.spec.id))

    def _fail_job(self, job: JobRecord, error: TaskFailure, stimulus_id: str, now: float,
                  out: list[Instruction]) -> None:
        for t in job.tasks.values():
            if t.state not in TERMINAL:
                self._release_slot(t)
                self._move(t, CANCELLED, stimulus_id, now, out)
        self._finish_job(job, "failed", error, out)

    def _finish_job(self, job: JobRecord, state: Literal["done", "failed", "cancelled"],
                    error: TaskFailure | None, out: list[Instruction]) -> None:
        job.state = state
        out.append(JobFinished(job.id, state, error))

    # --- checks ------------------------------------------------------------------------------

    def validate_state(self) -> None:
        """Assert the invariants (tests call this after every scenario)."""
        queued = {(e[3], e[4]) for e in self._ready}
        timed = {j for _, j in self._job_deadlines}
        for job in self.jobs.values():
            not_done = sum(1 for t in job.tasks.values() if t.state != DONE)
            if job.state == "running":
                assert job.remaining == not_done, (job.id, job.remaining, not_done)
                assert job.deadline is None or job.id in timed, job.id
            for t in job.tasks.values():
                if t.state == DISPATCHED:
                    assert t.node is not None and (job.id, t.spec.id) in self.nodes[t.node].running
                    assert t.due > 0.0 and t.sends >= 1, (t.spec.id, t.due, t.sends)
                if t.state == READY and job.state == "running":
                    assert (job.id, t.spec.id) in queued
                if t.state == PENDING:
                    assert t.waiting_on, f"{t.spec.id} waits on nothing"
                for d in t.waiting_on:
                    assert job.tasks[d].state != DONE or t.state in TERMINAL
        for n in self.nodes.values():
            for job_id, task_id in n.running:
                assert self.jobs[job_id].tasks[task_id].state == DISPATCHED
            assert len(n.running) <= max(n.slots, self.policy.small_slots) or not n.alive
            specs = [self.jobs[j].tasks[t].spec for j, t in n.running]
            assert sum(1 for s in specs if not self.policy.is_small(s)) <= n.slots or not n.alive
            heavy = sum(1 for s in specs if s.cost_s >= self.policy.heavy_task_s)
            assert heavy <= min(n.slots, self.policy.heavy_slots) or not n.alive

    def tasks_of(self, job: str) -> Iterable[TaskRecord]:
        return self.jobs[job].tasks.values()


_HANDLERS: dict[type, Callable[[DispatchState, Event, list[Instruction]], None]] = {
    SubmitJob: DispatchState._on_submit,  # type: ignore[dict-item]
    TaskSucceeded: DispatchState._on_success,  # type: ignore[dict-item]
    TaskErred: DispatchState._on_error,  # type: ignore[dict-item]
    TaskAcked: DispatchState._on_ack,  # type: ignore[dict-item]
    Tick: DispatchState._on_tick,  # type: ignore[dict-item]
    NodeUp: DispatchState._on_node_up,  # type: ignore[dict-item]
    NodeDown: DispatchState._on_node_down,  # type: ignore[dict-item]
    CancelJob: DispatchState._on_cancel,  # type: ignore[dict-item]
}


def place_near_inputs(t: TaskRecord, candidates: Sequence[NodeRecord], s: DispatchState) -> NodeRecord | None:
    """Prefer the node already holding the most input bytes, then the least loaded."""
    if not candidates:
        return None
    job = s.jobs[t.job]
    local: dict[str, int] = {}
    for d in t.spec.deps:
        dep = job.tasks[d]
        if dep.node:
            local[dep.node] = local.get(dep.node, 0) + dep.spec.output_bytes
    return max(candidates, key=lambda n: (local.get(n.name, 0), -len(n.running) / max(n.slots, 1),
                                          n.name))
