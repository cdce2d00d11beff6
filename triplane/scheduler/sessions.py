"""Client session leases: what a client holds, freed when it stops saying it is alive.

An SDK opens a session (``POST /v1/sessions`` -> id and ``ttl_s``) and renews it (``POST
/v1/sessions/{id}/renew``, a heartbeat every third of the TTL). Uploads and jobs made with
``X-Triplane-Session: <id>`` are tagged with it. A session ends

* when its client closes it (``DELETE /v1/sessions/{id}``: ``tp.disconnect()``, atexit), or
* when its lease expires (the client died without saying so: SIGKILL, a lost machine);

either way the scheduler releases what it still holds: its uploads (files and executor
cache entries) and its jobs (cancelled if running, their tiles released). Values the
client released one by one before (``DELETE /v1/tensors/{id}``, ``DELETE /v1/jobs/{id}``)
are untagged then.

:class:`Sessions` is the pure table (no I/O, an injected clock, so tests step time);
:func:`reap` is the scheduler's loop that ends expired leases. Leases live in the leader's
memory only: a restarted scheduler forgets them, and what they held stays until it is
released by id (documented in docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from triplane.scheduler.errors import Forbidden, NotFound

__all__ = ["DEFAULT_TTL_S", "Held", "Lease", "Sessions", "reap", "release_held"]

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 30.0


@dataclass
class Lease:
    id: str
    owner: str
    expires: float
    uploads: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Held:
    """What an ended session still held: to be released."""

    session: str
    uploads: tuple[str, ...]
    jobs: tuple[str, ...]


class Sessions:
    """Session id -> :class:`Lease`. Every method is O(1) but :meth:`expired`."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._leases: dict[str, Lease] = {}
        self._upload_of: dict[str, str] = {}  # upload -> session
        self._job_of: dict[str, str] = {}  # job -> session

    def open(self, owner: str) -> Lease:
        lease = Lease(f"s-{secrets.token_hex(12)}", owner, self.clock() + self.ttl_s)
        self._leases[lease.id] = lease
        return lease

    def get(self, sid: str, owner: str, *, admin: bool = False) -> Lease:
        """The lease, NotFound when unknown or expired, Forbidden when another owner's."""
        lease = self._leases.get(sid)
        if lease is None:
            raise NotFound(f"unknown or expired session {sid[:40]!r}; open a new one (POST /v1/sessions)")
        if not admin and lease.owner != owner:
            raise Forbidden(f"session {sid} is not one of {owner!r}'s")
        return lease

    def renew(self, sid: str, owner: str, *, admin: bool = False) -> Lease:
        lease = self.get(sid, owner, admin=admin)
        lease.expires = self.clock() + self.ttl_s
        return lease

    def tag_upload(self, lease: Lease, upload: str) -> None:
        lease.uploads.add(upload)
        self._upload_of[upload] = lease.id

    def tag_job(self, lease: Lease, job: str) -> None:
        lease.jobs.add(job)
        self._job_of[job] = lease.id

    def untag_upload(self, upload: str) -> None:
        sid = self._upload_of.pop(upload, None)
        if sid is not None and sid in self._leases:
            self._leases[sid].uploads.discard(upload)

    def untag_job(self, job: str) -> None:
        sid = self._job_of.pop(job, None)
        if sid is not None and sid in self._leases:
            self._leases[sid].jobs.discard(job)

    def close(self, sid: str) -> Held:
        """End a session (the caller checked it may); what it held."""
        lease = self._leases.pop(sid)
        for u in lease.uploads:
            self._upload_of.pop(u, None)
        for j in lease.jobs:
            self._job_of.pop(j, None)
        return Held(sid, tuple(sorted(lease.uploads)), tuple(sorted(lease.jobs)))

    def expired(self) -> list[Held]:
        """End every session whose lease ran out; what they held."""
        now = self.clock()
        return [self.close(sid) for sid, lease in list(self._leases.items()) if lease.expires <= now]

    def __contains__(self, sid: object) -> bool:
        return sid in self._leases

    def __len__(self) -> int:
        return len(self._leases)


async def release_held(held: Held, release_upload: Callable[[str], Awaitable[object]],
                       release_job: Callable[[str], Awaitable[object]]) -> None:
    """Release everything of an ended session; a failure is logged, the rest goes on."""
    for job in held.jobs:
        try:
            await release_job(job)
        except Exception as e:  # an unknown job (never stored), a metadb hiccup: log and go on
            log.warning("session %s: releasing job %s failed: %s", held.session, job, e)
    for upload in held.uploads:
        try:
            await release_upload(upload)
        except Exception as e:
            log.warning("session %s: releasing upload %s failed: %s", held.session, upload, e)


async def reap(sessions: Sessions, release_upload: Callable[[str], Awaitable[object]],
               release_job: Callable[[str], Awaitable[object]], every_s: float | None = None) -> None:
    """Forever: end expired leases and release what they held (a task of the scheduler)."""
    every = every_s if every_s is not None else max(0.05, min(1.0, sessions.ttl_s / 10))
    while True:
        await asyncio.sleep(every)
        for held in sessions.expired():
            log.info("session %s expired: releasing %d uploads and %d jobs", held.session,
                     len(held.uploads), len(held.jobs))
            await release_held(held, release_upload, release_job)
