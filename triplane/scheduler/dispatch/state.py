"""The dispatcher's core: a pure state machine over jobs and their tasks.

Events go in (``handle(event) -> list[Instruction]``); instructions come out for the I/O
shell to carry out (send a packet, finish a job, persist transitions). Nothing here does
I/O or reads a clock: time arrives in events. So every rule below is tested without a
socket.

Task states and the transitions allowed between them (``TRANSITIONS``)::

    waiting --deps done--> ready --placed--> dispatched --reply ok--> done
       ^                    ^                    |
       |                    +---- drift ---------+   (deadline missed after retries,
       |                    |                    |    node lost, infra error)
       +-- lineage ---------+-- (done, output lost with its node, still needed)
    any non-terminal --user error / attempts exhausted--> failed
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

Delivery: a task may run more than once (retransmits reuse the attempt number, drifts take
the next one); only the first reply of the current attempt counts, later or stale ones
are ignored, so each result is recorded once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

TaskStateName = Literal["waiting", "ready", "dispatched", "done", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"done", "failed", "cancelled"})


# --- events (stimuli) -------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    id: str
    op: str
    deps: tuple[str, ...] = ()
    cost_s: float = 0.001          # predicted run time, for the deadline
    output_bytes: int = 0
    is_output: bool = False        # fetched by the user: keep (and recompute if lost)
    node: str | None = None        # the node placement chose (followed while alive, not excluded)
    priority: float = 0.0          # lower goes first within a job: the plan's predicted start


@dataclass(frozen=True)
class Event:
    stimulus_id: str


@dataclass(frozen=True)
class SubmitJob(Event):
    """A new job. ``done`` lists (task, node) pairs already computed whose output is held by
    a live node (a restarted scheduler resuming a job): they start done, not waiting."""

    job: str
    tasks: tuple[TaskSpec, ...]
    now: float
    done: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TaskSucceeded(Event):
    job: str
    task: str
    attempt: int
    node: str
    now: float


@dataclass(frozen=True)
class TaskErred(Event):
    job: str
    task: str
    attempt: int
    node: str
    kind: Literal["user", "infra"]
    message: str
    now: float


@dataclass(frozen=True)
class TaskAcked(Event):
    """The executor confirmed it received the attempt (or, for a retransmission, that it is
    still running it): stop retransmitting until the attempt's run time (its cost-model
    timeout) has passed again, and restart its count of unanswered sends."""

    job: str
    task: str
    attempt: int
    now: float


@dataclass(frozen=True)
class Tick(Event):
    """Time passes: deadlines are checked."""

    now: float


@dataclass(frozen=True)
class NodeUp(Event):
    node: str
    slots: int
    now: float


@dataclass(frozen=True)
class NodeDown(Event):
    node: str
    now: float


@dataclass(frozen=True)
class CancelJob(Event):
    job: str
    now: float


# --- instructions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Send (or resend: same attempt) the task's packet to ``node``."""

    job: str
    task: str
    attempt: int
    node: str
    deadline: float
    pull_from: tuple[tuple[str, str], ...]  # (input task id, node holding it)
    resend: bool = False


@dataclass(frozen=True)
class JobFinished:
    job: str
    state: Literal["done", "failed", "cancelled"]
    error: str | None = None


@dataclass(frozen=True)
class Transitioned:
    """For the event log and metadb (persisted in batches by the shell)."""

    job: str
    task: str
    start: str
    finish: str
    attempt: int
    node: str | None
    stimulus_id: str
    at: float


Instruction = Send | JobFinished | Transitioned


# --- state ----------------------------------------------------------------------------------


@dataclass
class TaskState:
    job: str
    spec: TaskSpec
    state: TaskStateName = "waiting"
    attempt: int = 0
    node: str | None = None           # where it runs / its output lives
    deadline: float = 0.0
    sends: int = 0                    # transmissions of the current attempt
    not_before: float = 0.0           # placed again no earlier than this (retry backoff)
    excluded: set[str] = field(default_factory=set)  # nodes that failed it (infra)
    waiting_on: set[str] = field(default_factory=set)
    dependents: set[str] = field(default_factory=set)
    error: str | None = None
    log: list[Transitioned] = field(default_factory=list)


@dataclass
class JobState:
    id: str
    tasks: dict[str, TaskState]
    state: Literal["running", "done", "failed", "cancelled"] = "running"
    remaining: int = 0
    seq: int = 0  # submission order: an earlier job's ready tasks go first


@dataclass
class NodeState:
    name: str
    slots: int
    alive: bool = True
    running: set[tuple[str, str]] = field(default_factory=set)  # (job, task)


@dataclass(frozen=True)
class Policy:
    """Knobs of the dispatcher. The deadline of an attempt's send is
    ``now + max(min_timeout_s, deadline_factor * cost_s)``; after ``max_sends`` sends of
    one attempt without a reply, the task drifts to another node; after ``max_attempts``
    attempts it fails. A drifted task waits ``retry_backoff_s * 2**(attempt - 1)`` (at most
    ``max_backoff_s``) before it is placed again, so a transient fault (a registry
    restarting, a peer not yet known dead) does not burn every attempt in a millisecond.

    A node runs ``slots`` tasks at once (``NodeUp``), and up to ``small_slots`` when the
    extra ones are *small*: predicted under ``small_task_s`` with outputs of at most
    ``small_task_bytes``. A round trip of such a task is mostly waking the processes at
    both ends; with more of them queued an executor runs them back to back instead of
    sleeping between packets (measured on the 10,000-task benchmark, 2 executors: 16
    rather than 4 in flight cut the executors' CPU time per job by about a quarter). A
    task that is not small still waits until fewer than ``slots`` run there, and a
    *heavy* one (predicted at least ``heavy_task_s``) until fewer than ``heavy_slots``:
    an executor runs its kernels one after another, so a heavy task sent behind three
    others waits for them all, however urgent it is (the MLP step: a critical-path
    matmul ready at 0.94 s ran at 1.09 s, behind four matmuls the plan put after it).
    Two in flight still overlap one task's input pulls with another's kernel.

    ``eager``: send a placed task ahead of its inputs when they all run on its node
    (module doc: Early sends)."""

    min_timeout_s: float = 0.5
    deadline_factor: float = 10.0
    max_sends: int = 3
    max_attempts: int = 8
    retry_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    small_task_s: float = 1e-4
    small_task_bytes: int = 1 << 16
    small_slots: int = 16
    heavy_task_s: float = 0.01
    heavy_slots: int = 2
    eager: bool = True

    def is_small(self, spec: TaskSpec) -> bool:
        return spec.cost_s < self.small_task_s and spec.output_bytes <= self.small_task_bytes

    def capacity(self, spec: TaskSpec, slots: int) -> int:
        """How many tasks a node with ``slots`` may run when ``spec`` joins them."""
        if self.is_small(spec):
            return max(slots, self.small_slots)
        if spec.cost_s >= self.heavy_task_s:
            return min(slots, self.heavy_slots)
        return slots


Placer = Callable[[TaskState, Sequence[NodeState], "DispatchState"], NodeState | None]


class InvalidTransition(RuntimeError):
    pass


class DispatchState:
    """All jobs, tasks and nodes the dispatcher knows, and the rules that move them."""

    def __init__(self, policy: Policy | None = None, placer: Placer | None = None) -> None:
        self.policy = policy or Policy()
        self.placer = placer or place_near_inputs
        self.jobs: dict[str, JobState] = {}
        self.nodes: dict[str, NodeState] = {}
        # (job seq, priority, ready seq, job, task) of the tasks awaiting a node: a heap
        self._ready: list[tuple[int, float, int, str, str]] = []
        self._seq = 0  # tie-breaker: first ready, first placed
        self._jobs_seen = 0

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
        tasks = {t.id: TaskState(ev.job, t) for t in ev.tasks}
        for t in tasks.values():
            for d in t.spec.deps:
                if d not in tasks:
                    raise ValueError(f"task {t.spec.id!r} depends on unknown task {d!r}")
                tasks[d].dependents.add(t.spec.id)
            t.waiting_on = set(t.spec.deps)
        self._jobs_seen += 1
        job = JobState(ev.job, tasks, remaining=len(tasks), seq=self._jobs_seen)
        for task_id, node in ev.done:
            t = tasks[task_id]  # KeyError for an unknown task: a caller bug
            t.state, t.node = "done", node
            job.remaining -= 1
        for t in tasks.values():
            if t.state == "done":
                for d in t.dependents:
                    tasks[d].waiting_on.discard(t.spec.id)
        self.jobs[ev.job] = job
        for t in tasks.values():
            if t.state != "waiting":
                continue
            if not t.waiting_on:
                self._move(t, "ready", ev.stimulus_id, ev.now, out)
        if job.remaining == 0:
            self._finish_job(job, "done", None, out)

    def _on_success(self, ev: TaskSucceeded, out: list[Instruction]) -> None:
        t = self._current(ev.job, ev.task, ev.attempt)
        if t is None or t.state != "dispatched":
            return  # a duplicate or stale reply: the result is recorded once
        self._release_slot(t)
        t.node = ev.node
        self._move(t, "done", ev.stimulus_id, ev.now, out)
        job = self.jobs[ev.job]
        job.remaining -= 1
        for d in t.dependents:
            dep = job.tasks[d]
            dep.waiting_on.discard(t.spec.id)
            if dep.state == "waiting" and (not dep.waiting_on or self._early(job, dep)):
                self._move(dep, "ready", ev.stimulus_id, ev.now, out)
        if job.remaining == 0 and job.state == "running":
            self._finish_job(job, "done", None, out)

    def _on_error(self, ev: TaskErred, out: list[Instruction]) -> None:
        t = self._current(ev.job, ev.task, ev.attempt)
        if t is None or t.state != "dispatched":
            return
        self._release_slot(t)
        if ev.kind == "user":
            t.error = ev.message
            self._move(t, "failed", ev.stimulus_id, ev.now, out)
            self._fail_job(self.jobs[ev.job], f"task {t.spec.id} ({t.spec.op}): {ev.message}",
                           ev.stimulus_id, ev.now, out)
        else:
            t.excluded.add(ev.node)
            self._drift(t, f"infra error on {ev.node}: {ev.message}", ev.stimulus_id, ev.now, out)

    def _on_ack(self, ev: TaskAcked, out: list[Instruction]) -> None:
        t = self._current(ev.job, ev.task, ev.attempt)
        if t is None or t.state != "dispatched":
            return
        # Delivered: a resend now would only be dropped as a duplicate. Wait for the run
        # time instead; a resend after that fetches a lost reply from the executor's cache
        # (or another ack while it still runs). An executor that acks is alive and working:
        # a slow or queued task must not drift for it (a dead node drifts through NodeDown).
        t.deadline = max(t.deadline, ev.now + self._timeout(t))
        t.sends = 1

    def _on_tick(self, ev: Tick, out: list[Instruction]) -> None:
        # Only dispatched tasks have deadlines, and each sits in its node's ``running`` set:
        # walking those keeps a tick O(in flight), not O(every task of every job).
        due = sorted(key for n in self.nodes.values() for key in n.running
                     if ev.now >= self.jobs[key[0]].tasks[key[1]].deadline)
        for job_id, task_id in due:
            job = self.jobs[job_id]
            t = job.tasks[task_id]
            if job.state != "running" or t.state != "dispatched":
                continue
            assert t.node is not None
            if t.sends < self.policy.max_sends:
                # Lost packet or reply: retransmit with the same attempt id.
                t.sends += 1
                t.deadline = ev.now + self._timeout(t)
                out.append(Send(job.id, t.spec.id, t.attempt, t.node, t.deadline,
                                self._pull_from(t), resend=True))
            else:
                self._release_slot(t)
                t.excluded.add(t.node)
                self._drift(t, f"no reply from {t.node} after {t.sends} sends",
                            ev.stimulus_id, ev.now, out)

    def _on_node_up(self, ev: NodeUp, out: list[Instruction]) -> None:
        n = self.nodes.get(ev.node)
        if n is None:
            self.nodes[ev.node] = NodeState(ev.node, ev.slots)
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
                if t.state == "dispatched":
                    self._release_slot(t)
                    t.excluded.add(ev.node)
                    self._drift(t, f"node {ev.node} lost", ev.stimulus_id, ev.now, out)
                elif t.state == "done":
                    self._lost_output(job, t, ev.stimulus_id, ev.now, out)

    def _on_cancel(self, ev: CancelJob, out: list[Instruction]) -> None:
        job = self.jobs.get(ev.job)
        if job is None or job.state != "running":
            return
        for t in job.tasks.values():
            if t.state not in TERMINAL:
                self._release_slot(t)
                self._move(t, "cancelled", ev.stimulus_id, ev.now, out)
        self._finish_job(job, "cancelled", None, out)

    # --- rules -----------------------------------------------------------------------------

    def _drift(self, t: TaskState, why: str, stimulus_id: str, now: float,
               out: list[Instruction]) -> None:
        """Re-run ``t`` elsewhere with the next attempt, or fail the job if out of attempts."""
        job = self.jobs[t.job]
        self._recall(job, t, stimulus_id, now, out)
        if t.attempt + 1 >= self.policy.max_attempts:
            t.error = f"{why}; gave up after {t.attempt + 1} attempts"
            self._move(t, "failed", stimulus_id, now, out)
            self._fail_job(job, f"task {t.spec.id} ({t.spec.op}): {t.error}", stimulus_id, now, out)
            return
        t.attempt += 1
        t.node = None
        t.not_before = now + min(self.policy.retry_backoff_s * 2 ** (t.attempt - 1),
                                 self.policy.max_backoff_s)
        missing = {d for d in t.spec.deps if not self._available(job.tasks[d])}
        if missing:  # an input was lost too: wait for its recomputation
            t.waiting_on = missing
            self._move(t, "waiting", stimulus_id, now, out)
        else:
            self._move(t, "ready", stimulus_id, now, out)

    def _lost_output(self, job: JobState, t: TaskState, stimulus_id: str, now: float,
                     out: list[Instruction]) -> None:
        """A done task's output died with its node: recompute it if anyone still needs it
        (lineage), and likewise, recursively, its own inputs that died too."""
        needed = t.spec.is_output or any(job.tasks[d].state != "done" for d in t.dependents)
        if not needed:
            return
        t.node = None
        t.attempt += 1
        job.remaining += 1
        for d in t.dependents:
            dep = job.tasks[d]
            if dep.state in ("waiting", "ready"):
                dep.waiting_on.add(t.spec.id)
                if dep.state == "ready":
                    self._unready(dep, stimulus_id, now, out)
        lost = [d for d in t.spec.deps if not self._available(job.tasks[d])]
        t.waiting_on = set(lost)
        self._move(t, "waiting" if lost else "ready", stimulus_id, now, out)
        for d in lost:
            if job.tasks[d].state == "done":
                self._lost_output(job, job.tasks[d], stimulus_id, now, out)

    def _available(self, t: TaskState) -> bool:
        """Is ``t``'s output computed and held by a live node?"""
        n = self.nodes.get(t.node or "")
        return t.state == "done" and n is not None and n.alive

    def _unready(self, t: TaskState, stimulus_id: str, now: float, out: list[Instruction]) -> None:
        self._ready = [e for e in self._ready if (e[3], e[4]) != (t.job, t.spec.id)]
        heapq.heapify(self._ready)
        self._move(t, "waiting", stimulus_id, now, out)

    def _schedule(self, ev: Event, out: list[Instruction]) -> None:
        """Place ready tasks on nodes with free slots, in queue order (module doc: Order).

        Stops as soon as no live node has a free slot, so an event costs O(tasks placed),
        not O(tasks ready): a job of 10,000 independent tasks must not rescan its whole
        queue on every reply."""
        now = getattr(ev, "now", 0.0)
        if not self._ready:
            return
        alive = [n for n in self.nodes.values() if n.alive]
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
            if t.state != "ready":
                continue
            if t.waiting_on and not self._early(job, t):
                # Made ready early, but an input has left this task's node since: wait for it.
                self._move(t, "waiting", ev.stimulus_id, now, out)
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
                node: NodeState | None = chosen
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
            t.deadline = now + self._timeout(t)
            node.running.add(key)
            self._move(t, "dispatched", ev.stimulus_id, now, out, queue=False)
            out.append(Send(t.job, spec.id, t.attempt, node.name, t.deadline, self._pull_from(t)))
            for d in t.dependents:  # queued behind it, they go now if early (module doc)
                dep = job.tasks[d]
                if dep.state == "waiting" and self._early(job, dep):
                    self._move(dep, "ready", ev.stimulus_id, now, out)
        for entry in skipped:
            heapq.heappush(ready, entry)

    # --- helpers -----------------------------------------------------------------------------

    def _preferred(self, t: TaskState) -> NodeState | None:
        """The task's placed node if it is alive and has not failed it; else None (the
        placer chooses: a dead or excluded node's tasks drift as usual)."""
        name = t.spec.node
        if name is None or name in t.excluded:
            return None
        n = self.nodes.get(name)
        return n if n is not None and n.alive else None

    def _early(self, job: JobState, t: TaskState) -> bool:
        """May waiting ``t`` be sent now, ahead of its unfinished inputs? Yes when the policy
        allows it and each of them is dispatched to ``t``'s placed node (module doc)."""
        if not self.policy.eager:
            return False
        home = self._preferred(t)
        if home is None:
            return False
        for d in t.waiting_on:
            dep = job.tasks[d]
            if dep.state != "dispatched" or dep.node != home.name:
                return False
        return True

    def _recall(self, job: JobState, t: TaskState, stimulus_id: str, now: float,
                out: list[Instruction]) -> None:
        """``t`` leaves its node: drift the tasks sent there early to wait for its output."""
        if not t.node:
            return
        for d in t.dependents:
            dep = job.tasks[d]
            if dep.state == "dispatched" and dep.node == t.node and t.spec.id in dep.waiting_on:
                self._release_slot(dep)
                self._drift(dep, f"its input {t.spec.id} left {t.node}", stimulus_id, now, out)

    def _timeout(self, t: TaskState) -> float:
        return max(self.policy.min_timeout_s, self.policy.deadline_factor * t.spec.cost_s)

    def _pull_from(self, t: TaskState) -> tuple[tuple[str, str], ...]:
        """(input task, node holding it) of the inputs held elsewhere, and of those still
        being made on ``t``'s own node (an early send: the executor waits for them)."""
        job = self.jobs[t.job]
        return tuple((d, n) for d in t.spec.deps
                     if (n := job.tasks[d].node) and (n != t.node or d in t.waiting_on))

    def _current(self, job: str, task: str, attempt: int) -> TaskState | None:
        j = self.jobs.get(job)
        if j is None or j.state != "running":
            return None
        t = j.tasks.get(task)
        if t is None or t.attempt != attempt:
            return None
        return t

    def _release_slot(self, t: TaskState) -> None:
        if t.node and t.node in self.nodes:
            self.nodes[t.node].running.discard((t.job, t.spec.id))

    def _move(self, t: TaskState, finish: TaskStateName, stimulus_id: str, now: float,
              out: list[Instruction], queue: bool = True) -> None:
        start = t.state
        if (start, finish) not in TRANSITIONS:
            raise InvalidTransition(f"task {t.job}/{t.spec.id}: {start} -> {finish} is not allowed "
                                    f"(stimulus {stimulus_id})")
        t.state = finish
        rec = Transitioned(t.job, t.spec.id, start, finish, t.attempt, t.node, stimulus_id, now)
        t.log.append(rec)
        out.append(rec)
        if finish == "ready" and queue:
            self._seq += 1
            heapq.heappush(self._ready, (self.jobs[t.job].seq, t.spec.priority, self._seq, t.job, t.spec.id))

    def _fail_job(self, job: JobState, error: str, stimulus_id: str, now: float,
                  out: list[Instruction]) -> None:
        for t in job.tasks.values():
            if t.state not in TERMINAL:
                self._release_slot(t)
                self._move(t, "cancelled", stimulus_id, now, out)
        self._finish_job(job, "failed", error, out)

    def _finish_job(self, job: JobState, state: Literal["done", "failed", "cancelled"],
                    error: str | None, out: list[Instruction]) -> None:
        job.state = state
        out.append(JobFinished(job.id, state, error))

    # --- checks ------------------------------------------------------------------------------

    def validate_state(self) -> None:
        """Assert the invariants (tests call this after every scenario)."""
        queued = {(e[3], e[4]) for e in self._ready}
        for job in self.jobs.values():
            not_done = sum(1 for t in job.tasks.values() if t.state != "done")
            if job.state == "running":
                assert job.remaining == not_done, (job.id, job.remaining, not_done)
            for t in job.tasks.values():
                if t.state == "dispatched":
                    assert t.node is not None and (job.id, t.spec.id) in self.nodes[t.node].running
                if t.state == "ready" and job.state == "running":
                    assert (job.id, t.spec.id) in queued
                if t.state == "waiting":
                    assert t.waiting_on, f"{t.spec.id} waits on nothing"
                for d in t.waiting_on:
                    assert job.tasks[d].state != "done" or t.state in TERMINAL
        for n in self.nodes.values():
            for job_id, task_id in n.running:
                assert self.jobs[job_id].tasks[task_id].state == "dispatched"
            assert len(n.running) <= max(n.slots, self.policy.small_slots) or not n.alive
            specs = [self.jobs[j].tasks[t].spec for j, t in n.running]
            assert sum(1 for s in specs if not self.policy.is_small(s)) <= n.slots or not n.alive
            heavy = sum(1 for s in specs if s.cost_s >= self.policy.heavy_task_s)
            assert heavy <= min(n.slots, self.policy.heavy_slots) or not n.alive

    def tasks_of(self, job: str) -> Iterable[TaskState]:
        return self.jobs[job].tasks.values()


TRANSITIONS: frozenset[tuple[str, str]] = frozenset({
    ("waiting", "ready"), ("ready", "dispatched"), ("dispatched", "done"),
    ("dispatched", "ready"), ("dispatched", "waiting"),  # drift
    ("done", "ready"), ("done", "waiting"), ("ready", "waiting"),  # lineage recompute
    ("waiting", "failed"), ("ready", "failed"), ("dispatched", "failed"),
    ("waiting", "cancelled"), ("ready", "cancelled"), ("dispatched", "cancelled"),
})

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


def place_near_inputs(t: TaskState, candidates: Sequence[NodeState], s: DispatchState) -> NodeState | None:
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
