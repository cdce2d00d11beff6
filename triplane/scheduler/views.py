"""What the dashboard draws that no page of rows could give it (docs/dashboard.md): a job's
task timeline as aggregates per node and time bucket (and its tasks once a window is
small), a job's graph cut to a readable size with its op counts, and the tiles every
memory engine holds. Each is one grouped read of the metadb (``metadb/aggregates.py``) or a
walk of a graph in memory (kept for the last ``GRAPHS_KEPT`` asked: a job's graph never
changes). A running job's timeline is cut from a histogram kept between requests
(``timeline.py``: each refresh regroups only the newest rows); an ended job's is grouped
from its rows, exactly. The grouped reads run in a worker thread whatever the database: unlike a page
of rows (``Admin._read``), they hand few rows back to Python, and SQLite computes them
without the GIL, so the event loop dispatches meanwhile (bench/dashboard.py).

Errors: ``NotFound`` for an unknown job, ``BadRequest`` for a window or size out of bounds.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

from triplane import metadb as mdb
from triplane.metadb import aggregates as agg
from triplane.proto.ir import Graph
from triplane.scheduler.errors import BadRequest, NotFound
from triplane.scheduler.timeline import FIELDS, JobHistogram

if TYPE_CHECKING:
    from triplane.scheduler.service import Scheduler

__all__ = ["Views"]

MAX_GRAPH_NODES = 2000
MAX_BUCKETS = 2000
GRAPHS_KEPT = 32
HISTOGRAMS_KEPT = 16


def _task(t: mdb.TaskInfo) -> dict[str, Any]:
    return {"id": t.task_id, "op": t.op, "state": t.state, "attempt": t.attempt, "node": t.node,
            "start": t.started_at, "end": t.finished_at, "predicted_s": t.predicted_s,
            "error": None if t.error_kind is None else {"kind": t.error_kind,
                                                        "message": t.error_message or ""}}


def _graph_view(job: str, source: str, graph: Graph, limit: int) -> dict[str, Any]:
    shown = dict(itertools.islice(graph.nodes.items(), limit))
    out = []
    for nid, n in shown.items():
        program = n.attrs.get("program") if n.op == "fused" else None
        out.append({"id": nid, "op": n.op, "shape": list(n.shape), "dtype": n.dtype,
                    "inputs": [i for i in n.inputs if i in shown],
                    "hidden_inputs": sum(1 for i in n.inputs if i not in shown),
                    "steps": [str(step[0]) for step in program] if program else None})
    total = len(graph.nodes)
    return {"job": job, "source": source, "total": total, "truncated": total > limit,
            "ops": dict(Counter(n.op for n in graph.nodes.values()).most_common()),
            "outputs": [o for o in graph.outputs if o in shown], "nodes": out}


def _count(record: Any, key: str) -> int:
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _spill_and_persist(stats: dict[str, Any]) -> dict[str, Any]:
    """A node's spill and persist counters from its ``stats/<node>`` record (an engine that
    does not spill: ``spill`` None; a count missing or malformed: 0)."""
    spill = stats.get("spill")
    persist = stats.get("persist")
    return {"spill": None if not isinstance(spill, dict) else {
                "tiles": _count(spill, "spills"), "bytes": _count(spill, "spilled_bytes"),
                "reads": _count(spill, "reads"), "read_bytes": _count(spill, "read_bytes"),
                "on_disk": _count(spill, "file_used")},
            "persisted": {"tiles": _count(persist, "tiles"), "bytes": _count(persist, "bytes")}}


class Views:
    """See the module doc."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self._graphs: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._histograms: OrderedDict[str, JobHistogram] = OrderedDict()
        self._lock = threading.Lock()  # the histograms are kept up to date in worker threads

    def _histogram(self, job: str) -> JobHistogram:
        h = self._histograms.pop(job, None) or JobHistogram(job)
        self._histograms[job] = h
        if len(self._histograms) > HISTOGRAMS_KEPT:
            self._histograms.popitem(last=False)
        return h

    async def timeline(self, job: str, *, start: float | None, end: float | None, buckets: int,
                       tasks: int) -> dict[str, Any]:
        """The body of ``GET /v1/jobs/{job}/timeline`` (docs/api.md)."""
        if not 1 <= buckets <= MAX_BUCKETS:
            raise BadRequest(f"buckets must be in 1..{MAX_BUCKETS}, got {buckets}")
        if not 0 <= tasks <= 5000:
            raise BadRequest(f"tasks must be in 0..5000, got {tasks}")
        if start is not None and end is not None and not end > start:
            raise BadRequest(f"end ({end}) must be after start ({start})")

        await self.s.admin.settled(job)  # a job that just ended: its last rows written first
        live = self.s.jobs.live.get(job)
        running = live is not None and live.state in ("queued", "running")

        def read() -> dict[str, Any]:
            with self.s.db.read() as s:
                first, last, rows = agg.task_bounds(s, job)
                t0 = start if start is not None else first
                t1 = end if end is not None else last
                if t1 is None and t0 is not None:  # started, none finished yet (or not yet written)
                    t1 = max(time.time(), t0 + 1e-3)
                body: dict[str, Any] = {"job": job, "first": first, "last": last, "rows": rows,
                                        "start": t0, "end": t1, "buckets": buckets, "bucket_s": None,
                                        "nodes": [], "tasks": None}
                if t0 is None or t1 is None:
                    return body
                if not t1 > t0:
                    t1 = t0 + 1e-3
                    body["end"] = t1
                width = (t1 - t0) / buckets
                body["bucket_s"] = width
                per: dict[str, dict[str, list[float]]] | None = None
                with self._lock:
                    if not running:  # an ended job's rows stay as they are: one exact grouping
                        self._histograms.pop(job, None)
                    elif first is not None and last is not None:
                        hist = self._histogram(job)
                        hist.refresh(s, first, last, rows)
                        if hist.fine_enough(t0, t1, buckets):
                            per = hist.lanes(t0, t1, buckets)
                if per is None:  # an ended job, or a window too narrow for the cells: its rows
                    per = {}
                    for r in agg.timeline_buckets(s, job, t0, t1, buckets):
                        node = r["node"] or "?"
                        lanes = per.setdefault(node, {k: [0] * buckets for k in FIELDS})
                        for k in lanes:
                            lanes[k][r["bucket"]] += r[k]
                body["nodes"] = [{"node": n, **lanes} for n, lanes in sorted(per.items())]
                started = sum(sum(lane["tasks"]) for lane in per.values())
                if tasks and started <= tasks:  # else no row read: the count says it is too many
                    rows_in = agg.tasks_in_window(s, job, t0, t1, tasks + 1)
                    if len(rows_in) <= tasks:  # a window this small is drawn task by task
                        body["tasks"] = [_task(t) for t in rows_in]
                return body

        try:
            return await asyncio.to_thread(read)
        except (mdb.UnknownJobError, mdb.InvalidInputError):
            raise NotFound(f"unknown job {job[:128]!r}") from None

    async def graph(self, job: str, *, limit: int) -> dict[str, Any]:
        """The body of ``GET /v1/jobs/{job}/graph``: the compiled graph of a job this
        scheduler holds (fused groups as ``fused`` nodes with their steps), else the
        canonical graph stored at submit; its first ``limit`` nodes in graph order, the
        op counts of all, and the edges among the nodes shown."""
        if not 1 <= limit <= MAX_GRAPH_NODES:
            raise BadRequest(f"limit must be in 1..{MAX_GRAPH_NODES}, got {limit}")
        kept = self._graphs.get((job, limit))
        if kept is not None:
            self._graphs.move_to_end((job, limit))
            return kept
        live = self.s.jobs.live.get(job)
        graph: Graph | None = None
        source = "compiled"
        if live is not None:
            graph = live.plan.plan.graph
        else:
            def read() -> Graph:
                with self.s.db.read() as s:
                    info = mdb.get_job(s, job)
                    return Graph.from_json(mdb.get_graph(s, info.graph_hash).canonical)

            try:
                graph = await asyncio.to_thread(read)
            except (mdb.UnknownJobError, mdb.InvalidInputError, mdb.NotFoundError):
                raise NotFound(f"unknown job {job[:128]!r}") from None
            source = "submitted"
        # a graph of 100,000 nodes is a walk of some 50 ms: off the loop, which dispatches
        body = await asyncio.to_thread(_graph_view, job, source, graph, limit)
        self._graphs[(job, limit)] = body
        if len(self._graphs) > GRAPHS_KEPT:
            self._graphs.popitem(last=False)
        return body

    async def storage(self) -> dict[str, Any]:
        """The body of ``GET /v1/storage``: every memory engine's capacity and free bytes (as
        its node last published them), what its node spilled to disk and wrote to a
        persistence target (the counters of ``stats/<node>``: an executor has one memory
        engine, so its node's counters are its engine's), beside the tiles and bytes the
        metadb says it holds."""
        from triplane.registry import list_memory_engines, list_node_stats

        def read() -> list[dict[str, Any]]:
            with self.s.db.read() as s:
                return agg.tile_totals(s)

        totals = await asyncio.to_thread(read)
        stats = await list_node_stats(self.s.registry)
        engines = [{"node": m.node, "engine": m.engine, "kind": m.kind, "capacity": m.capacity,
                    "free": m.free, **_spill_and_persist(stats.get(m.node, {}))}
                   for m in await list_memory_engines(self.s.registry)]
        return {"engines": sorted(engines, key=lambda e: (e["node"], e["engine"])), "tiles": totals}
