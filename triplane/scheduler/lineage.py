"""Lineage recompute: a finished job's lost result tiles, computed again from its plan.

A done job's fetched tiles stay on the executors that made them until the job is
released. When a fetch (``results.py``) or a ref (``refs.py``) finds such a tile's
holder gone and no persistence target keeping it, the tile is computed again from the
job's lineage -- its plan, compiled again from the metadb for a job this process no
longer holds in memory. Only the tasks needed run again: the lost ones and, recursively,
those of their inputs that are not available (a job's intermediates are freed when it
ends; a fetched tile whose holder lives, or a persisted one, is read where it is). They
run as the same job (its tiles keep their names), each with the next attempt number
after its recorded one, so no executor answers from its replay memory. Each gets a
``task.recomputed`` event (``reason``: ``lost:<node>``, ``from: "done"``); the job stays
done throughout, and concurrent readers of one job share one recompute. (An input run again
because it was freed when the job ended has ``reason: "freed"``.)

Errors: ``NotFound`` when the tiles cannot be computed again (an upload its tasks read
was released, another job's tile they read is lost too, no executor is registered, a
task failed): the message says why and names the tile; ``Unavailable`` when the
recompute is not done after ``RECOMPUTE_WAIT_S`` (it goes on; a later read waits for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from triplane import metadb as mdb
from triplane.engines.memory.persist import store_node
from triplane.scheduler.compiler.jobplan import JobPlan, is_job_tile
from triplane.scheduler.dispatch.events import TaskSpec
from triplane.scheduler.errors import NotFound, Unavailable
from triplane.scheduler.jobs import Jobs
from triplane.scheduler.livejob import fetched_tasks_of

if TYPE_CHECKING:
    from triplane.scheduler.results import Results

__all__ = ["Lineage", "needed_tasks"]

log = logging.getLogger("triplane.scheduler.service")

RECOMPUTE_WAIT_S = 300.0  # a reader waits this long for a recompute, then is told to come back


def needed_tasks(specs: Iterable[TaskSpec], lost: Iterable[str],
                 available: Callable[[str], bool]) -> set[str]:
    """The tasks to run again for ``lost``: those, and recursively every input of a task
    run again that is not ``available`` (pure)."""
    deps = {s.id: s.deps for s in specs}
    need: set[str] = set()
    todo = list(lost)
    while todo:
        t = todo.pop()
        if t in need:
            continue
        need.add(t)
        todo.extend(d for d in deps[t] if d not in need and not available(d))
    return need


class Lineage:
    """Recomputes lost tiles of done jobs (see the module doc)."""

    def __init__(self, jobs: Jobs, results: Results) -> None:
        self.jobs, self.results = jobs, results
        self._running: dict[str, asyncio.Future[dict[str, str]]] = {}
        self.recomputes = 0  # jobs run again for lost tiles (for tests and metrics)

    def lost(self, plan: JobPlan, holders: Mapping[str, str], tasks: Iterable[str]) -> list[str]:
        """Those of ``tasks`` whose output no live executor and no persistence target holds."""
        return [t for t in tasks if self._where(plan, holders, t, None) is None]

    def _where(self, plan: JobPlan, holders: Mapping[str, str], task: str,
               kept: set[str] | None) -> str | None:
        """Where ``task``'s output can be read: its holder if live (and, given ``kept``, the
        tasks whose tiles outlived the job -- the fetched ones -- one of those), else the
        persistence target keeping it."""
        node = holders.get(task)
        live = node in self.jobs.shell.nodes and not self.jobs.shell.suspected(node or "")
        if live and (kept is None or task in kept):
            return node
        tiles = plan.task_tiles(task)
        for kind, target in self.results.persist.items():
            if tiles and all(tile in target for tile in tiles):
                return store_node(kind)
        return None

    async def settled(self, job: str) -> None:
        """Once the recompute of ``job`` under way, if any, ended (whatever it gave)."""
        fut = self._running.get(job)
        if fut is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(fut)

    async def recover(self, job: str, plan: JobPlan, holders: Mapping[str, str],
                      tasks: Iterable[str]) -> dict[str, str]:
        """The job's holders once those of ``tasks`` that are lost were computed again
        (as they are when none is); NotFound when they cannot be."""
        tasks = list(tasks)
        running = self._running.get(job)
        if running is not None:  # another reader's recompute of this job: wait for it, then look
            holders = await asyncio.shield(running)
        lost = self.lost(plan, holders, tasks)
        if not lost:
            return dict(holders)
        fut = asyncio.ensure_future(self._run(job, plan, dict(holders), lost))
        self._running[job] = fut

        def done(_: object) -> None:
            if self._running.get(job) is fut:
                del self._running[job]

        fut.add_done_callback(done)
        return await asyncio.shield(fut)

    async def _run(self, job: str, plan: JobPlan, holders: dict[str, str], lost: list[str]) -> dict[str, str]:
        kept = fetched_tasks_of(plan)
        where = {s.id: self._where(plan, holders, s.id, kept) for s in plan.specs}
        need = needed_tasks(plan.specs, lost, lambda t: where.get(t) is not None)
        what = f"tile {plan.task_tiles(lost[0])[0] if plan.task_tiles(lost[0]) else lost[0]} of job {job}"
        if not self.jobs.shell.nodes:
            raise NotFound(f"{what} was held by {holders.get(lost[0])}, which is gone, and no executor "
                           "is registered to compute it again")
        await self._check_inputs(job, plan, need, what)
        attempts, created, owner = await asyncio.to_thread(self._recorded, job)
        done = tuple((s.id, where[s.id] or holders.get(s.id) or "") for s in plan.specs if s.id not in need)
        again = tuple((t, attempts.get(t, 0) + 1) for t in sorted(need))
        for t in sorted(need):
            gone = holders.get(t)
            # a lost result names its holder; an input of one was freed when the job ended,
            # or died with its holder too
            why = f"lost:{gone}" if t in lost or gone else "freed"
            self.jobs.journal.events.publish("task.recomputed", job=job, task=t, node=gone,
                                             attempt=attempts.get(t, 0) + 1, reason=why,
                                             **{"from": "done", "to": "ready"})
        log.info("job %s: %d lost tile(s) computed again from lineage (%d of %d tasks)",
                 job, len(lost), len(need), len(plan.specs))
        self.recomputes += 1
        self.results.earlier.forget(job)  # its recorded holders change
        live = self.jobs.recompute(plan, created, done, again, owner)
        try:
            await asyncio.wait_for(live.ended.wait(), RECOMPUTE_WAIT_S)
        except asyncio.TimeoutError:
            raise Unavailable(f"{what} was lost and is being computed again: not done after "
                              f"{RECOMPUTE_WAIT_S:g} s (try again later)") from None
        if live.recompute_error is not None:
            raise NotFound(f"{what} was lost and could not be computed again: "
                           f"{live.recompute_error.get('message')}")
        return dict(live.holders)

    async def _check_inputs(self, job: str, plan: JobPlan, need: set[str], what: str) -> None:
        """NotFound when a task to run again reads an upload released since, or another
        job's tile (a ref) whose holder is gone too (not computed again in turn)."""
        for t in need:
            tpl = plan.templates.get(t)
            for tile in tpl.uploads if tpl is not None else ():
                tensor = tile.partition("@")[0]
                if not is_job_tile(tile):
                    if self.jobs.store.get(tensor) is None:
                        raise NotFound(f"{what} was lost and cannot be computed again: its input, "
                                       f"uploaded tensor {tensor}, was released")
                    continue
                owner, _, task = tile.partition(".")
                holder = await self._holder_of(owner, task)
                if holder not in self.jobs.shell.nodes:
                    raise NotFound(f"{what} was lost and cannot be computed again: its input, tile {tile} "
                                   f"of job {owner}, was held by {holder}, which is gone too")

    async def _holder_of(self, job: str, task: str) -> str | None:
        """The node holding another job's tile (None if unknown)."""
        live = self.jobs.live.get(job)
        try:
            view = live if live is not None else await self.results.earlier.get(job)
        except Exception:  # an unknown job, a record that cannot be rebuilt: no holder known
            return None
        plan = view.plan
        return view.holders.get(plan.task_of(task) if plan is not None else task)

    def _recorded(self, job: str) -> tuple[dict[str, int], float, str | None]:
        """(task -> its last attempt, when the job was submitted, its owner) from the metadb."""
        with self.jobs.db.read() as s:
            info = mdb.get_job(s, job)
            attempts = {t.task_id: t.attempt for t in mdb.list_tasks(s, job)}
        live = self.jobs.live.get(job)
        return attempts, (live.created if live is not None else info.created_at), info.owner
