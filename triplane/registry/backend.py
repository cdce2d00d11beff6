"""The registry's narrow contract: KV + Lease + Watch + compare-and-swap, async.

Every backend (in-memory, etcd, a vendor's) implements :class:`RegistryBackend`. Keys
are plain strings *relative to the backend's prefix* (default ``/triplane/``): a caller
writes ``nodes/n1`` and the etcd backend stores ``/triplane/nodes/n1``, so two clusters
(or two tests) sharing one etcd never see each other. Values are bytes; the typed layer
(:mod:`triplane.registry.nodes`) encodes JSON on top.

Errors (all :class:`RegistryError`, itself a ``TriplaneError``):

    RegistryError             base
    ├── LeaseNotFound         the lease expired, was revoked, or never existed
    └── RegistryUnavailable   the server cannot be reached (retry later; state unknown)

Bad arguments (empty key, non-bytes value, ``ttl <= 0``) raise ``ValueError`` /
``TypeError`` before anything is sent, so they never corrupt the store.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

from triplane.proto.errors import TriplaneError

__all__ = [
    "DEFAULT_PREFIX",
    "Entry",
    "KeepAlive",
    "LeaseNotFound",
    "RegistryBackend",
    "RegistryError",
    "RegistryUnavailable",
    "Watch",
    "WatchEvent",
    "check_key",
    "check_ttl",
    "check_value",
]

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/triplane/"


class RegistryError(TriplaneError):
    """Base of the registry's errors."""


class LeaseNotFound(RegistryError, LookupError):
    """The lease is gone (expired, revoked, or lost with a wiped server): re-grant and re-put."""


class RegistryUnavailable(RegistryError, ConnectionError):
    """The registry server could not be reached; the operation may or may not have applied."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored key. ``version`` counts writes since creation (1 after create, etcd's
    meaning); ``mod_revision`` is the store-wide revision of the last write; ``lease`` is
    0 when the key is not bound to a lease."""

    key: str
    value: bytes
    version: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change under a watched prefix. For ``delete`` the value is ``b""``."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    revision: int


def check_key(key: object, *, allow_empty: bool = False) -> str:
    """The key, validated: a ``str`` without NUL, non-empty unless it is a prefix."""
    if not isinstance(key, str):
        raise TypeError(f"registry keys are str, got {type(key).__name__}")
    if not key and not allow_empty:
        raise ValueError("registry key must not be empty")
    if "\x00" in key:
        raise ValueError(f"registry key {key!r} contains a NUL character")
    return key


def check_value(value: object) -> bytes:
    """The value as bytes; anything that is not bytes-like is a ``TypeError``."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"registry values are bytes, got {type(value).__name__} (encode it first)")


def check_ttl(ttl_s: object) -> float:
    """A lease TTL in seconds, finite and positive."""
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
        raise TypeError(f"lease ttl must be a number of seconds, got {type(ttl_s).__name__}")
    if not math.isfinite(ttl_s) or ttl_s <= 0:
        raise ValueError(f"lease ttl must be a positive number of seconds, got {ttl_s!r}")
    return float(ttl_s)


class Watch(abc.ABC):
    """An established watch: an async context manager and an async iterator of events.

    The watch exists once ``__aenter__`` returns, so every change made after that point
    is delivered (in revision order). Leaving the block cancels it. Iterating raises
    :class:`RegistryUnavailable` if the backend cannot keep the watch alive.
    """

    async def __aenter__(self) -> Watch:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cancel()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    @abc.abstractmethod
    async def start(self) -> None:
        """Establish the watch (idempotent)."""

    @abc.abstractmethod
    async def next_event(self) -> WatchEvent | None:
        """The next event, or ``None`` once cancelled."""

    @abc.abstractmethod
    async def cancel(self) -> None:
        """Stop the watch; pending ``next_event`` calls return ``None``. Idempotent."""


class RegistryBackend(abc.ABC):
    """KV + Lease + Watch + CAS. All methods are coroutines except ``watch_prefix``.

    Semantics every backend must meet (checked by :mod:`triplane.registry.testing`):

    * ``put`` with an unknown or expired lease raises :class:`LeaseNotFound` and stores
      nothing.
    * A lease's keys vanish (with delete events) within about its TTL after the last
      refresh; a backend may round the TTL up to its own minimum (etcd: whole seconds,
      at least ~2 s) and reports it through :meth:`grant_lease`'s caller-facing TTL.
    * ``create`` / ``compare_and_swap`` / ``compare_and_delete`` are atomic: of two
      racing ``create`` calls on one key exactly one returns ``True``.
    """

    prefix: str

    # -- key/value ------------------------------------------------------------------
    @abc.abstractmethod
    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Store ``value`` under ``key`` (bound to ``lease`` if given); the new revision."""

    @abc.abstractmethod
    async def get(self, key: str) -> Entry | None:
        """The entry under ``key``, or ``None``."""

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> list[Entry]:
        """Every entry whose key starts with ``prefix`` (may be ``""``), sorted by key."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; how many were deleted."""

    # -- compare-and-swap -----------------------------------------------------------
    @abc.abstractmethod
    async def create(self, key: str, value: bytes, lease: int | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent; whether it was stored."""

    @abc.abstractmethod
    async def compare_and_swap(self, key: str, value: bytes, *, expected_value: bytes | None = None,
                               expected_version: int | None = None,
                               lease: int | None = None) -> bool:
        """Replace ``key``'s value only if its current value and/or version match.

        At least one of ``expected_value`` / ``expected_version`` is required
        (``ValueError`` otherwise). An absent key never matches. Whether it replaced.
        """

    @abc.abstractmethod
    async def compare_and_delete(self, key: str, *, expected_value: bytes | None = None,
                                 expected_version: int | None = None) -> bool:
        """Delete ``key`` only if its value and/or version match; whether it deleted."""

    # -- leases ---------------------------------------------------------------------
    @abc.abstractmethod
    async def grant_lease(self, ttl_s: float) -> int:
        """A new lease id living ``ttl_s`` seconds (rounded up by the backend if needed)."""

    @abc.abstractmethod
    async def refresh_lease(self, lease: int) -> None:
        """Restart the lease's TTL; :class:`LeaseNotFound` if it is gone."""

    @abc.abstractmethod
    async def revoke_lease(self, lease: int) -> bool:
        """End the lease now, deleting its keys; whether it still existed."""

    @abc.abstractmethod
    async def lease_ttl(self, lease: int) -> tuple[float, float] | None:
        """``(ttl_s, left_s)``: the lease's TTL as granted (rounded by the backend) and the
        seconds left before it expires unless refreshed (etcd: whole seconds); ``None`` if
        the lease is gone. ``ttl_s - left_s`` is the time since it was last refreshed."""

    # -- watch ----------------------------------------------------------------------
    @abc.abstractmethod
    def watch_prefix(self, prefix: str) -> Watch:
        """A watch over keys under ``prefix``; use as ``async with backend.watch_prefix(p) as w``."""

    # -- lifecycle ------------------------------------------------------------------
    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and background tasks. Leases are not revoked. Idempotent."""

    async def __aenter__(self) -> RegistryBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def keep_alive(self, lease: int, ttl_s: float,
                   on_lost: Callable[[], None] | None = None) -> KeepAlive:
        """A started :class:`KeepAlive` for ``lease`` (must be called in a running loop)."""
        ka = KeepAlive(self, lease, ttl_s, on_lost=on_lost)
        ka.start()
        return ka


class KeepAlive:
    """Refreshes a lease every ``ttl/3`` seconds in a background asyncio task.

    If the lease is found gone (:class:`LeaseNotFound`) the task sets :attr:`lost`, calls
    ``on_lost`` once and ends: whoever owns the keys must re-grant and re-put them. If the
    server is unreachable it keeps retrying at the same period (the lease may still be
    alive on the server). :meth:`stop` cancels the task without revoking the lease.
    """

    def __init__(self, backend: RegistryBackend, lease: int, ttl_s: float,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.backend = backend
        self.lease = lease
        self.period = check_ttl(ttl_s) / 3.0
        self.on_lost = on_lost
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"keepalive-{self.lease}")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.backend.refresh_lease(self.lease)
            except LeaseNotFound:
                log.warning("registry lease %x is gone; its keys must be re-registered", self.lease)
                self.lost.set()
                if self.on_lost is not None:
                    self.on_lost()
                return
            except RegistryUnavailable as exc:
                log.warning("registry unreachable while refreshing lease %x: %s", self.lease, exc)

    async def stop(self) -> None:
        """Cancel the refresh task (idempotent); the lease then expires by itself."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
