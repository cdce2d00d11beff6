"""A job this scheduler dispatches, as the jobs table holds it (``jobs.py``), and what a plan
says of it that the table reads: the tasks holding its fetched tiles, a preferred executor."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from triplane.proto.packet import Carried
from triplane.scheduler.cluster import Factors
from triplane.scheduler.compiler.jobplan import JobPlan

__all__ = ["LiveJob", "fetched_tasks_of", "prefer_node"]


@dataclass
class LiveJob:
    """A job this process dispatches (or finished recently)."""

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
    factors: Factors | None = None
    # task -> node holding its output, set when the job ends (the dispatcher's state of
    # the job is dropped then): fetches and releases read it.
    holders: dict[str, str] = field(default_factory=dict)
    done: int = 0  # tasks done, set when the job ends
    failure: dict[str, Any] | None = None  # set before cancelling it: it fails with this error
    # lineage.py runs a done job's lost tiles again: it stays done whatever that run gives
    recomputing: bool = False
    recompute_error: dict[str, Any] | None = None  # why the last such run did not finish
    locs: Mapping[str, str] = field(default_factory=dict)  # submitted node -> its SDK's source line
    # tile -> its value, carried by its task's reply (a grouped task's smallest outputs): a
    # fetch of it is answered from here, without a round trip to its executor
    carried: dict[str, Carried] = field(default_factory=dict)
    retried: bool = False  # set when it ends: a task of it ran more than once (drifted, recomputed)

    def name_of(self, task: str) -> str:
        """The submitted node a task came from (a tile task: the tensor it is part of)."""
        lay = self.plan.layout
        nid = lay.origin.get(task, task) if lay is not None and lay.tiled else task
        return self.back.get(nid, nid)


def fetched_tasks_of(plan: JobPlan) -> set[str]:
    """The tasks whose output tiles hold the job's fetched tensors."""
    keep: set[str] = set()
    for name, nid in plan.fetch.items():
        grid = plan.fetch_grid(name)
        keep.update(grid.tiles.values() if grid is not None else (plan.task_of(nid),))
    return keep


def prefer_node(plan: JobPlan, node: str | None) -> JobPlan:
    """``plan`` whose tasks the dispatcher places (no computed placement, no ref holder to
    prefer: a small job, a compiled step) prefer executor ``node``: the dispatcher sends
    them there while it is up and has not failed them, else places them as usual
    (``DispatchState._preferred``), so a preference for a node that is down, drained or
    unknown costs nothing. A client that keeps its uploads' tiles on one executor this
    way (the model server's replicas, docs/serving.md) reads them there locally."""
    if node is None or not plan.specs or all(s.node is not None for s in plan.specs):
        return plan
    specs = tuple(s if s.node is not None else dataclasses.replace(s, node=node) for s in plan.specs)
    return dataclasses.replace(plan, specs=specs)
