"""The scheduler's Prometheus metrics (``GET /metrics``; docs/observability.md).

The dispatcher's hooks only add to plain ints, dicts and bucket lists on the event loop
(``Counts``); the Prometheus families are built from them when a scraper asks
(``SchedulerCollector``, registered in the scheduler's own ``CollectorRegistry``: two
schedulers in one process do not share metrics). No labelled ``.inc()`` runs per task: a
task costs a few dict and list updates in the hook that sees its transitions anyway.

Executor memory is the scheduler's to report: each executor publishes its memory engines'
capacity and free bytes in the registry, and the scheduler reads those records (at most
once a second, when scraped) and exposes them per node and engine. Executors serve no
metrics endpoint of their own.

Task counters are by op and node: ``dispatched`` (each send of an attempt; a resent packet
is not a new dispatch), ``succeeded``, ``failed`` and ``drifted`` (taken off the node it
was sent to). Latencies: dispatch latency is from a task becoming ready to its send; task
latency from its send to its reply (both on the scheduler's clock, so the task latency
includes the network and the executor's queue). They count since this process started.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from triplane.proto.states import TaskState
from triplane.scheduler.dispatch.state import DispatchState, JobFinished, Transitioned
from triplane.scheduler.events import Event

__all__ = ["CONTENT_TYPE", "Counts", "Hist", "Metrics", "SchedulerCollector"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0, math.inf)
JOB_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, math.inf)
JOB_ENDS = {"job.done": "done", "job.failed": "failed", "job.cancelled": "cancelled"}
MEMORY_MAX_AGE_S = 1.0

_READY, _PENDING, _DISPATCHED = TaskState.READY, TaskState.PENDING, TaskState.DISPATCHED
_DONE, _FAILED = TaskState.DONE, TaskState.FAILED


class Hist:
    """A histogram as plain numbers: a count per bucket (upper bounds ``bounds``, the last
    +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative, as Prometheus wants them."""
        out, total = [], 0
        for b, c in zip(self.bounds, self.counts, strict=True):
            total += c
            out.append(("+Inf" if b == math.inf else repr(b), float(total)))
        return out


class Counts:
    """What the hooks count (event loop). ``state``: the dispatcher's state now (the
    shell replaces it when the scheduler steps down)."""

    def __init__(self, state: Callable[[], DispatchState]) -> None:
        self._state = state
        self.tasks: dict[tuple[str, str, str], int] = defaultdict(int)  # (what, op, node) -> n
        self.dispatch_latency = Hist(LATENCY_BUCKETS)
        self.task_latency = Hist(LATENCY_BUCKETS)
        self.job_durations: dict[str, Hist] = {}  # end state -> durations
        self._running: dict[str, float] = {}  # job -> when it started running
        self.queued = 0  # tasks ready (moves into ready less moves out of it)
        self._seen: DispatchState | None = None
        # The shell reports a job's end before the transitions of the same step, and the
        # job leaves the dispatcher's state at its end: its record waits here for them.
        self._ending: dict[str, Any] = {}

    def finished(self, f: JobFinished) -> None:
        """The dispatcher's finished hook (call it before the job leaves the state)."""
        js = self._state().jobs.get(f.job)
        if js is not None:
            self._ending[f.job] = js

    def transitions(self, ts: list[Transitioned]) -> None:
        """The dispatcher's transitions hook (beside the journal's)."""
        state = self._state()
        if state is not self._seen:  # a new leadership's dispatcher: its queue starts empty
            self._seen, self.queued = state, 0
        jobs = state.jobs
        if self._ending:
            jobs = {**self._ending, **jobs}
            self._ending = {}
        tasks = self.tasks
        for t in ts:
            f = t.finish
            if t.start is _READY:
                self.queued -= 1
            if f is _READY:
                self.queued += 1
            elif f is _DISPATCHED:
                rec = _record(jobs, t)
                if rec is not None:
                    tasks["dispatched", rec.spec.op, t.node or ""] += 1
                    log = rec.log
                    if len(log) > 1:
                        self.dispatch_latency.observe(max(0.0, t.at - log[-2].at))
            elif f is _DONE:
                rec = _record(jobs, t)
                if rec is not None:
                    tasks["succeeded", rec.spec.op, t.node or ""] += 1
                    log = rec.log
                    if len(log) > 1 and log[-2].finish is _DISPATCHED:
                        self.task_latency.observe(max(0.0, t.at - log[-2].at))
            elif f is _FAILED:
                rec = _record(jobs, t)
                if rec is not None:
                    tasks["failed", rec.spec.op, t.node or ""] += 1
            if t.start is _DISPATCHED and (f is _READY or f is _PENDING):
                rec = _record(jobs, t)
                if rec is not None:
                    log = rec.log
                    node = log[-2].node if len(log) > 1 else t.node
                    tasks["drifted", rec.spec.op, node or ""] += 1

    def event(self, e: Event) -> None:
        """An event of the bus (a sink): job durations, from running to its end."""
        if e.job is None:
            return
        if e.kind == "job.running":
            self._running[e.job] = e.at
        elif e.kind in JOB_ENDS:
            started = self._running.pop(e.job, None)
            if started is not None:
                state = JOB_ENDS[e.kind]
                h = self.job_durations.get(state)
                if h is None:
                    h = self.job_durations[state] = Hist(JOB_BUCKETS)
                h.observe(max(0.0, e.at - started))


def _record(jobs: dict[str, Any], t: Transitioned) -> Any:
    js = jobs.get(t.job)
    return None if js is None else js.tasks.get(t.task)


class Metrics:
    """A scheduler's metrics: ``counts`` (fed by the hooks), a registry with the collector,
    and ``render()`` for ``GET /metrics``. ``sources`` gives, at scrape time, what is read
    rather than counted (see ``SchedulerCollector``)."""

    def __init__(self, counts: Counts, sources: Callable[[], dict[str, Any]]) -> None:
        self.counts = counts
        self.sources = sources
        self.memory: list[Any] = []  # the registry's MemoryEngineInfo records, as last read
        self.memory_at = -math.inf
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SchedulerCollector(self))

    def memory_stale(self) -> bool:
        return time.monotonic() - self.memory_at > MEMORY_MAX_AGE_S

    def set_memory(self, records: list[Any]) -> None:
        self.memory, self.memory_at = records, time.monotonic()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class SchedulerCollector(Collector):
    """Builds every family from ``Metrics`` when scraped. ``sources()`` answers a dict of:
    ``queued`` (tasks ready, not yet sent), ``running`` (tasks sent, not yet answered),
    ``jobs_running``, ``plan_cache`` ((hits, misses)), ``sent``/``resent``/``replies``
    (the shell's packet counts), ``events`` (published) and ``subscribers``."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        c, src = self.m.counts, self.m.sources()
        helps = {
            "dispatched": "Task attempts sent to an executor, by op and node",
            "succeeded": "Tasks that succeeded, by op and node",
            "failed": "Tasks that failed, by op and node",
            "drifted": "Task attempts taken off their node and sent again, by op and node (the node left)",
        }
        for what, doc in helps.items():
            fam = CounterMetricFamily(f"triplane_tasks_{what}", doc, labels=["op", "node"])
            for (w, op, node), n in sorted(c.tasks.items()):
                if w == what:
                    fam.add_metric([op, node], n)
            yield fam
        yield _hist("triplane_dispatch_latency_seconds", "From a task becoming ready to its dispatch",
                    [([], c.dispatch_latency)])
        yield _hist("triplane_task_latency_seconds", "From a task's dispatch to its reply (scheduler clock)",
                    [([], c.task_latency)])
        yield _hist("triplane_job_duration_seconds", "From a job's start to its end, by how it ended",
                    [([state], h) for state, h in sorted(c.job_durations.items())], ["state"])
        yield GaugeMetricFamily("triplane_queue_depth", "Tasks ready and waiting for a free executor slot",
                                value=src["queued"])
        yield GaugeMetricFamily("triplane_tasks_running", "Tasks sent and not yet answered",
                                value=src["running"])
        yield GaugeMetricFamily("triplane_jobs_running", "Jobs being dispatched", value=src["jobs_running"])
        hits, misses = src["plan_cache"]
        yield CounterMetricFamily("triplane_plan_cache_hits", "Compiles answered by the plan cache",
                                  value=hits)
        yield CounterMetricFamily("triplane_plan_cache_misses", "Compiles the plan cache did not hold",
                                  value=misses)
        for name, doc in (("sent", "Task packets sent (resends included)"),
                          ("resent", "Task packets sent again (no ack in time)"),
                          ("replies", "Task replies received")):
            yield CounterMetricFamily(f"triplane_packets_{name}", doc, value=src[name])
        yield CounterMetricFamily("triplane_events_published", "Events published on the event stream",
                                  value=src["events"])
        yield GaugeMetricFamily("triplane_event_subscribers", "Event stream subscribers on the live feed",
                                value=src["subscribers"])
        cap = GaugeMetricFamily("triplane_executor_memory_capacity_bytes",
                                "Capacity of an executor's memory engine (registry record)",
                                labels=["node", "engine", "kind"])
        free = GaugeMetricFamily("triplane_executor_memory_free_bytes",
                                 "Free bytes of an executor's memory engine (registry record)",
                                 labels=["node", "engine", "kind"])
        for r in self.m.memory:
            cap.add_metric([r.node, r.engine, r.kind], r.capacity)
            free.add_metric([r.node, r.engine, r.kind], r.free)
        yield cap
        yield free


def _hist(name: str, doc: str, hists: list[tuple[list[str], Hist]],
          labels: Sequence[str] = ()) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, h in hists:
        fam.add_metric(values, h.buckets(), h.sum)
    return fam
