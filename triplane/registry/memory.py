"""In-memory registry backend: the embedded mode's registry and the unit tests' one.

A :class:`MemoryStore` holds the data (keys, leases, watchers) for one process and one
event loop at a time; any number of :class:`MemoryBackend` handles (each with its own
key prefix) share it, as several etcd clients share one server. Leases expire on a
monotonic clock (injectable for tests): expiry is checked lazily on every operation and
by a reaper task that sleeps until the next deadline, so watchers see the delete events
even when nobody else touches the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from triplane.registry.backend import (
    DEFAULT_PREFIX,
    Entry,
    LeaseNotFound,
    RegistryBackend,
    Watch,
    WatchEvent,
    check_key,
    check_ttl,
    check_value,
)

__all__ = ["MemoryBackend", "MemoryStore"]


@dataclass
class _Lease:
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class MemoryStore:
    """The shared state behind :class:`MemoryBackend` handles. Keys here are absolute."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.revision = 0
        self._data: dict[str, Entry] = {}
        self._leases: dict[int, _Lease] = {}
        # A random base, as etcd's lease ids are: a restarted store must not hand out the
        # ids of the leases its clients still hold (a stale keep-alive would revive them).
        self._lease_ids = itertools.count(secrets.randbits(40) << 16 | 1)
        self._watchers: set[_MemoryWatch] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    # -- lease expiry ---------------------------------------------------------------
    def expire(self) -> int:
        """Drop every lease past its deadline (and its keys); how many expired."""
        now = self.clock()
        dead = [lid for lid, lease in self._leases.items() if lease.deadline <= now]
        for lid in dead:
            self._drop_lease(lid)
        return len(dead)

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id)
        for key in sorted(lease.keys):
            self._remove(key)

    def _ensure_reaper(self) -> None:
        # The reaper belongs to the running loop; a store reused under a new loop (a new
        # asyncio.run) gets a new reaper instead of touching the dead loop's task.
        loop = asyncio.get_running_loop()
        if self._reaper is not None and not self._reaper.done() and self._reaper.get_loop() is loop:
            assert self._wake is not None
            self._wake.set()
            return
        self._wake = asyncio.Event()
        self._reaper = loop.create_task(self._reap(self._wake), name="memory-registry-reaper")

    async def _reap(self, wake: asyncio.Event) -> None:
        while True:
            self.expire()
            if not self._leases:
                wait: float | None = None
            else:
                wait = max(0.0, min(lease.deadline for lease in self._leases.values()) - self.clock())
            wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=None if wait is None else wait + 0.01)

    async def close(self) -> None:
        task, self._reaper = self._reaper, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- mutations (callers have already called expire()) ------------------------------
    def _live_lease(self, lease: int | None) -> int:
        if lease is None or lease == 0:
            return 0
        if lease not in self._leases:
            raise LeaseNotFound(f"lease {lease:x} not found (expired or revoked)")
        return lease

    def _store(self, key: str, value: bytes, lease: int) -> int:
        old = self._data.get(key)
        if old is not None and old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self.revision += 1
        version = (old.version + 1) if old is not None else 1
        self._data[key] = Entry(key, value, version, self.revision, lease)
        if lease:
            self._leases[lease].keys.add(key)
        self._notify(WatchEvent("put", key, value, self.revision))
        return self.revision

    def _remove(self, key: str) -> bool:
        old = self._data.pop(key, None)
        if old is None:
            return False
        if old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self.revision += 1
        self._notify(WatchEvent("delete", key, b"", self.revision))
        return True

    def _notify(self, event: WatchEvent) -> None:
        for watcher in list(self._watchers):
            if event.key.startswith(watcher.abs_prefix):
                watcher.queue.put_nowait(event)

    @staticmethod
    def _matches(entry: Entry | None, expected_value: bytes | None, expected_version: int | None) -> bool:
        if entry is None:
            return False
        if expected_value is not None and entry.value != expected_value:
            return False
        return expected_version is None or entry.version == expected_version


class _MemoryWatch(Watch):
    def __init__(self, store: MemoryStore, abs_prefix: str, strip: int) -> None:
        self.store = store
        self.abs_prefix = abs_prefix
        self.strip = strip
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        self._cancelled = False

    async def start(self) -> None:
        if not self._cancelled:
            self.store._watchers.add(self)

    async def next_event(self) -> WatchEvent | None:
        if self._cancelled:
            return None
        event = await self.queue.get()
        if event is None:
            return None
        return WatchEvent(event.kind, event.key[self.strip:], event.value, event.revision)

    async def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self.store._watchers.discard(self)
            self.queue.put_nowait(None)


class MemoryBackend(RegistryBackend):
    """A :class:`RegistryBackend` over a :class:`MemoryStore` (a private one by default)."""

    def __init__(self, store: MemoryStore | None = None, prefix: str = DEFAULT_PREFIX) -> None:
        self.store = store if store is not None else MemoryStore()
        self.prefix = check_key(prefix, allow_empty=True)
        self._watches: set[_MemoryWatch] = set()
        self._closed = False

    def _abs(self, key: str, *, allow_empty: bool = False) -> str:
        return self.prefix + check_key(key, allow_empty=allow_empty)

    def _rel(self, entry: Entry) -> Entry:
        e = entry
        return Entry(e.key[len(self.prefix):], e.value, e.version, e.mod_revision, e.lease)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        k, v = self._abs(key), check_value(value)
        self.store.expire()
        return self.store._store(k, v, self.store._live_lease(lease))

    async def get(self, key: str) -> Entry | None:
        k = self._abs(key)
        self.store.expire()
        entry = self.store._data.get(k)
        return None if entry is None else self._rel(entry)

    async def get_prefix(self, prefix: str) -> list[Entry]:
        p = self._abs(prefix, allow_empty=True)
        self.store.expire()
        return [self._rel(e) for k, e in sorted(self.store._data.items()) if k.startswith(p)]

    async def delete(self, key: str) -> bool:
        k = self._abs(key)
        self.store.expire()
        return self.store._remove(k)

    async def delete_prefix(self, prefix: str) -> int:
        p = self._abs(prefix, allow_empty=True)
        self.store.expire()
        keys = sorted(k for k in self.store._data if k.startswith(p))
        for k in keys:
            self.store._remove(k)
        return len(keys)

    async def create(self, key: str, value: bytes, lease: int | None = None) -> bool:
        k, v = self._abs(key), check_value(value)
        self.store.expire()
        lid = self.store._live_lease(lease)
        if k in self.store._data:
            return False
        self.store._store(k, v, lid)
        return True

    async def compare_and_swap(self, key: str, value: bytes, *, expected_value: bytes | None = None,
                               expected_version: int | None = None,
                               lease: int | None = None) -> bool:
        k, v = self._abs(key), check_value(value)
        _check_expectation(expected_value, expected_version)
        self.store.expire()
        lid = self.store._live_lease(lease)
        if not self.store._matches(self.store._data.get(k), expected_value, expected_version):
            return False
        self.store._store(k, v, lid)
        return True

    async def compare_and_delete(self, key: str, *, expected_value: bytes | None = None,
                                 expected_version: int | None = None) -> bool:
        k = self._abs(key)
        _check_expectation(expected_value, expected_version)
        self.store.expire()
        if not self.store._matches(self.store._data.get(k), expected_value, expected_version):
            return False
        return self.store._remove(k)

    async def grant_lease(self, ttl_s: float) -> int:
        ttl = check_ttl(ttl_s)
        self.store.expire()
        lid = next(self.store._lease_ids)
        self.store._leases[lid] = _Lease(ttl, self.store.clock() + ttl)
        self.store._ensure_reaper()
        return lid

    async def refresh_lease(self, lease: int) -> None:
        self.store.expire()
        found = self.store._leases.get(lease)
        if found is None:
            raise LeaseNotFound(f"lease {lease:x} not found (expired or revoked)")
        found.deadline = self.store.clock() + found.ttl
        self.store._ensure_reaper()

    async def lease_ttl(self, lease: int) -> tuple[float, float] | None:
        self.store.expire()
        found = self.store._leases.get(lease)
        if found is None:
            return None
        return found.ttl, max(0.0, found.deadline - self.store.clock())

    async def revoke_lease(self, lease: int) -> bool:
        self.store.expire()
        if lease not in self.store._leases:
            return False
        self.store._drop_lease(lease)
        return True

    def watch_prefix(self, prefix: str) -> Watch:
        watch = _MemoryWatch(self.store, self._abs(prefix, allow_empty=True), len(self.prefix))
        self._watches.add(watch)
        return watch

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.cancel()
        self._watches.clear()
        # A handle never owns the shared store's reaper; the last user calls store.close().


def _check_expectation(expected_value: bytes | None, expected_version: int | None) -> None:
    if expected_value is None and expected_version is None:
        raise ValueError("compare-and-swap needs expected_value and/or expected_version")
    if expected_value is not None:
        check_value(expected_value)
    bad_version = isinstance(expected_version, bool) or not isinstance(expected_version, int)
    if expected_version is not None and bad_version:
        raise TypeError(f"expected_version must be an int, got {type(expected_version).__name__}")
