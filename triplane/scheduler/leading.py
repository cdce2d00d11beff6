"""Leader election and what leading means for a scheduler (a mixin of ``Scheduler``).

With ``elect=True`` the scheduler campaigns for ``scheduler/leader``; elected, it
publishes ``scheduler/data`` (where executors pull uploads), watches the nodes and
resumes the unfinished jobs of the metadb. It watches its leadership: when the lease is
found gone or the key no longer names it (a wiped etcd forgets both), it steps down to
standby, forgets its in-memory jobs (the metadb has them) and campaigns again, so a
scheduler never needs an outside restart and two replicas never both dispatch for long.

Resume waits for the executors: a restarted scheduler (above all one serving the memory
registry itself, which starts empty) may lead before the executors holding the tiles of
its unfinished jobs have registered again. It waits, at most ``resume_wait_s``, for every
executor named by a done task row (or holding a ref a job reads, ``refs.py``), then counts
the tasks done there as done; the jobs are resumed in the background, so the API (and a
registry it serves) is up meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from triplane.registry import (
    Leadership,
    RegistryError,
    RegistryUnavailable,
    campaign,
    leader,
    list_nodes,
)
from triplane.scheduler.dispatch.state import DispatchState

log = logging.getLogger("triplane.scheduler.service")

DATA_KEY = "scheduler/data"


class Leading:
    """The leadership half of ``Scheduler`` (it supplies the attributes used here)."""

    # Provided by Scheduler:
    id: str
    role: str
    registry: Any
    lease_ttl_s: float
    journal: Any
    jobs: Any
    shell: Any
    resume_wait_s: float
    policy: Any
    host: str
    address: str
    data_port: int
    _leadership: Leadership | None
    _lead_tasks: list[asyncio.Task[Any]]
    _data_lease: int
    _data_keepalive: Any

    async def _campaign(self) -> None:
        """Lead whenever elected; on losing the lease (etcd wiped, a long pause) step down to
        standby, forget the in-memory jobs, and campaign again: whoever leads next resumes
        them from the metadb."""
        while True:
            self._leadership = await campaign(self.registry, self.id, self.lease_ttl_s)
            try:
                await self._lead()
            except RegistryUnavailable as e:
                log.warning("registry unavailable while taking the lead (%s); retrying", e)
                await self._step_down()
                await asyncio.sleep(0.5)
                continue
            await self._while_leading(self._leadership)
            log.error("scheduler %s lost its leadership; stepping down and campaigning again", self.id)
            await self._step_down()

    async def _while_leading(self, lead: Leadership) -> None:
        """Return once ``lead`` is lost: its lease found gone, or the key no longer names us
        (a wiped etcd forgets both; the keep-alive may only notice later)."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(lead.lost.wait(), 1.0)
                return
            try:
                if await leader(self.registry) != self.id:
                    return
            except RegistryError:
                continue  # unreachable: the lease decides

    async def _step_down(self) -> None:
        self.role = "standby"
        for t in self._lead_tasks:
            t.cancel()
        self._lead_tasks.clear()
        self.journal.flush()
        for live in self.jobs.live.values():
            live.ended.set()  # long-pollers re-read the status (from the metadb)
        # Finished jobs stay: their results are on the executors and still fetchable (a
        # client may be between "done" and its GET); the unfinished ones the next leader resumes.
        self.jobs.forget_unfinished()
        self.shell.state = DispatchState(self.policy)
        self.shell.nodes.clear()
        if self._leadership is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._leadership.resign(), 3.0)

    async def _lead(self) -> None:
        """Become the acting scheduler: publish the data endpoint, watch nodes, resume jobs."""
        loop = asyncio.get_running_loop()
        await self._publish_data()
        self._lead_tasks.append(loop.create_task(self._keep_data_published(), name="scheduler-data"))
        await self.journal.events.aopen()  # event ids continue from the metadb's
        nodes = await list_nodes(self.registry)
        await self.cluster.read_drained()  # drained nodes get no new tasks (docs/api.md)
        for n in nodes:
            self.shell.node_up(n)
        self._lead_tasks.append(self.shell.watch(self.registry))
        self.role = "leader"
        self.jobs.resumed.clear()
        self._lead_tasks.append(loop.create_task(self._resume(), name="scheduler-resume"))

    async def _resume(self) -> None:
        """Resume the unfinished jobs of the metadb once the executors their done task rows
        name are registered again, or ``resume_wait_s`` has passed (module doc)."""
        try:
            await self._resume_when_back()
        except Exception:  # a metadb outage: the jobs stay in the metadb for the next leader
            log.exception("resuming the unfinished jobs failed")
        finally:
            self.jobs.resumed.set()

    async def _resume_when_back(self) -> None:
        resumable = await asyncio.to_thread(self.jobs.load_resumable)
        if not resumable:
            return
        wanted = {t.node for _, _, _, tasks in resumable for t in tasks if t.state == "done" and t.node}
        wanted |= {n for _, _, b, _ in resumable for n in b.get("ref_nodes") or () if isinstance(n, str)}
        missing = wanted - set(self.shell.nodes)
        if missing:
            log.info("resuming %d job(s): waiting up to %.1f s for executor(s) %s, which hold tiles of "
                     "their done tasks, to register again", len(resumable), self.resume_wait_s,
                     ", ".join(sorted(missing)))
            loop = asyncio.get_running_loop()
            until = loop.time() + self.resume_wait_s
            while missing and loop.time() < until:
                await asyncio.sleep(0.05)
                missing = wanted - set(self.shell.nodes)
            if missing:
                log.warning("executor(s) %s did not register again: their done tasks run again",
                            ", ".join(sorted(missing)))
        await self.jobs.resume(resumable, set(self.shell.nodes))

    async def _publish_data(self) -> None:
        lease = await self.registry.grant_lease(self.lease_ttl_s)
        self._data_lease = lease
        value = json.dumps({"address": self.address, "data_port": self.data_port}, sort_keys=True).encode()
        await self.registry.put(DATA_KEY, value, lease=lease)
        self._data_keepalive = self.registry.keep_alive(lease, self.lease_ttl_s)

    async def _keep_data_published(self) -> None:
        """Executors find uploads through ``scheduler/data``: write it again if its lease goes."""
        while True:
            ka = self._data_keepalive
            try:
                while not ka.lost.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(ka.lost.wait(), 1.0)
                    try:
                        if await self.registry.get(DATA_KEY) is None:  # e.g. etcd wiped
                            break
                    except RegistryError:
                        continue
            finally:
                with contextlib.suppress(Exception):
                    await ka.stop()
            log.warning("scheduler/data is gone; publishing again")
            while True:
                try:
                    await self._publish_data()
                    break
                except RegistryError as e:
                    log.warning("cannot publish scheduler/data (%s); retrying", e)
                    await asyncio.sleep(0.5)
