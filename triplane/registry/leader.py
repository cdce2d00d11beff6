"""Leader election among scheduler replicas on the ``scheduler/leader`` key.

A candidate grants a lease and tries ``create(scheduler/leader, me, lease)``; the one
whose create succeeds leads for as long as it keeps the lease alive. The others watch
the key and try again when it is deleted (resignation, revocation or lease expiry), so
a standby takes over within about one TTL of the leader dying.

A leader whose keep-alive finds the lease gone sets :attr:`Leadership.lost` and must
stop acting as leader at once: another replica may already lead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from triplane.registry.backend import KeepAlive, RegistryBackend, RegistryUnavailable
from triplane.registry.records import check_name

__all__ = ["LEADER_KEY", "Leadership", "campaign", "leader"]

log = logging.getLogger(__name__)

LEADER_KEY = "scheduler/leader"


class Leadership:
    """Proof of being the leader; :meth:`resign` hands over, :attr:`lost` tells of losing it."""

    def __init__(self, backend: RegistryBackend, candidate_id: str, lease: int, value: bytes,
                 keep_alive: KeepAlive) -> None:
        self.backend = backend
        self.candidate_id = candidate_id
        self.lease = lease
        self.value = value
        self._keep_alive = keep_alive

    @property
    def lost(self) -> asyncio.Event:
        """Set once the lease is found gone: this replica is no longer the leader."""
        return self._keep_alive.lost

    async def resign(self) -> None:
        """Step down now: delete the key if it is still ours, then revoke the lease.

        Idempotent; a registry outage is logged, and the lease then expires by itself.
        """
        await self._keep_alive.stop()
        try:
            await self.backend.compare_and_delete(LEADER_KEY, expected_value=self.value)
            await self.backend.revoke_lease(self.lease)
        except RegistryUnavailable as exc:
            log.warning("resigning %s: registry unreachable (%s); lease will expire", self.candidate_id, exc)

    async def __aenter__(self) -> Leadership:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.resign()


async def leader(backend: RegistryBackend) -> str | None:
    """The current leader's id, or ``None`` (also for an unreadable value, with a warning)."""
    entry = await backend.get(LEADER_KEY)
    if entry is None:
        return None
    try:
        data = json.loads(entry.value)
        return str(data["id"])
    except (ValueError, TypeError, KeyError):
        log.warning("malformed %s value %r", LEADER_KEY, entry.value[:80])
        return None


async def campaign(backend: RegistryBackend, candidate_id: str, ttl_s: float = 5.0, *,
                   retry_s: float = 0.5) -> Leadership:
    """Wait until ``candidate_id`` is the leader; bound it with ``asyncio.wait_for``.

    Cancelling it leaves no key or lease behind. Registry outages are retried every
    ``retry_s`` seconds.
    """
    check_name(candidate_id, "candidate id")
    value = json.dumps({"id": candidate_id, "since": time.time()}, sort_keys=True).encode()
    while True:
        try:
            async with backend.watch_prefix(LEADER_KEY) as events:
                lease = await backend.grant_lease(ttl_s)
                won = False
                try:
                    won = await backend.create(LEADER_KEY, value, lease=lease)
                finally:
                    if not won:
                        with contextlib.suppress(RegistryUnavailable):
                            await backend.revoke_lease(lease)
                if won:
                    log.info("%s is the leader (lease %x)", candidate_id, lease)
                    return Leadership(backend, candidate_id, lease, value, backend.keep_alive(lease, ttl_s))
                # The watch predates the failed create, so the holder's delete cannot be missed.
                async for ev in events:
                    if ev.key == LEADER_KEY and ev.kind == "delete":
                        break
        except RegistryUnavailable as exc:
            log.warning("campaign %s: registry unreachable (%s); retrying", candidate_id, exc)
            await asyncio.sleep(retry_s)
