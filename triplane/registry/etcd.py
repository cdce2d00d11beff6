"""etcd v3 registry backend over ``aetcd`` (the maintained asyncio fork of python-etcd3).

``aetcd`` is an optional dependency (the ``cluster`` extra); importing this module without
it is fine, constructing :class:`EtcdBackend` raises an ``ImportError`` naming the package.

Failure semantics: gRPC reconnects by itself (backoff capped at 1 s here); while etcd is
down every call raises :class:`RegistryUnavailable` after at most ``timeout_s``. A watch
survives a reconnect by resuming from the revision after the last event it delivered; if
that history is gone (etcd compacted it, or lost its data and its revision or raft term
went backwards), iterating raises ``RegistryUnavailable`` and the caller must re-list
(``watch_nodes`` does). Like etcd's own Go client, a watch cannot tell a wiped server
that has already caught up with the old revision from the old one; readers that must be
exact after a disaster re-list (the typed layer's registrations re-write themselves).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from triplane.registry.backend import (
    DEFAULT_PREFIX,
    Entry,
    LeaseNotFound,
    RegistryBackend,
    RegistryError,
    RegistryUnavailable,
    Watch,
    WatchEvent,
    check_key,
    check_ttl,
    check_value,
)

try:  # optional: only the cluster mode needs it
    import aetcd
    import aetcd.exceptions as aetcd_errors
except ImportError:  # pragma: no cover - exercised only where aetcd is absent
    aetcd = None

__all__ = ["EtcdBackend"]

log = logging.getLogger(__name__)

_CHANNEL_OPTIONS = {
    # Reconnect quickly after an etcd restart: gRPC's default backoff grows to 120 s.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """Map aetcd's exceptions onto the registry's tree."""
    try:
        yield
    except (aetcd_errors.ConnectionFailedError, aetcd_errors.ConnectionTimeoutError) as exc:
        raise RegistryUnavailable(f"etcd unreachable: {exc}") from exc
    except asyncio.TimeoutError as exc:
        raise RegistryUnavailable("etcd did not answer in time") from exc
    except aetcd_errors.ClientError as exc:
        if "lease not found" in str(exc):
            raise LeaseNotFound(str(exc)) from exc
        raise RegistryError(f"etcd error: {exc}") from exc


class _EtcdWatch(Watch):
    def __init__(self, backend: EtcdBackend, abs_prefix: bytes) -> None:
        self.backend = backend
        self.abs_prefix = abs_prefix
        self._watch: Any = None
        self._iter: AsyncIterator[Any] | None = None
        self._next_rev = 0
        self._term = 0
        self._cancelled = False

    async def _open(self) -> None:
        client = self.backend.client
        with _translated():
            header = (await client.get_prefix(self.abs_prefix, keys_only=True)).header
            if not self._next_rev:
                # Pin the start revision so nothing written after start() is missed.
                self._next_rev = header.revision + 1
            elif header.revision + 1 < self._next_rev or header.raft_term < self._term:
                # Revisions and raft terms never go back on a live cluster: its data was lost.
                # (A wiped server that has already caught up can slip through; see module doc.)
                raise RegistryUnavailable("etcd history went backwards (data wiped); re-list")
            self._term = max(self._term, header.raft_term)
            self._watch = await client.watch_prefix(self.abs_prefix, start_revision=self._next_rev)
        self._iter = aiter(self._watch)

    async def start(self) -> None:
        if self._iter is None and not self._cancelled:
            await self._open()

    async def next_event(self) -> WatchEvent | None:
        if self._iter is None:
            await self.start()
        while not self._cancelled:
            assert self._iter is not None
            try:
                event = await anext(self._iter)
            except StopAsyncIteration:
                return None
            except (aetcd_errors.RevisionCompactedError, aetcd_errors.ClientError, OSError) as exc:
                if self._cancelled:
                    return None
                await self._resume(exc)
                continue
            self._next_rev = event.kv.mod_revision + 1
            key = event.kv.key.decode()[len(self.backend.prefix):]
            kind = "put" if event.kind == "PUT" else "delete"
            value = bytes(event.kv.value) if kind == "put" else b""
            return WatchEvent(kind, key, value, event.kv.mod_revision)
        return None

    async def _resume(self, cause: BaseException) -> None:
        if isinstance(cause, aetcd_errors.RevisionCompactedError):
            raise RegistryUnavailable(f"watch history compacted ({cause}); re-list the registry") from cause
        log.warning("etcd watch on %r broke (%s); resuming from revision %d",
                    self.abs_prefix, cause, self._next_rev)
        deadline = asyncio.get_running_loop().time() + self.backend.timeout_s * 3
        while not self._cancelled:
            try:
                await self._open()
                return
            except RegistryUnavailable as exc:
                if "went backwards" in str(exc) or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await self._watch.cancel()


class EtcdBackend(RegistryBackend):
    """A :class:`RegistryBackend` on an etcd v3 server (``etcd://host:port``)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 2379, *, prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = 5.0) -> None:
        if aetcd is None:
            raise ImportError("the etcd registry needs the 'aetcd' package: pip install 'triplane[cluster]'")
        self.prefix = check_key(prefix, allow_empty=True)
        self.timeout_s = float(timeout_s)
        self.host, self.port = host, int(port)
        # aetcd's timeout is per RPC; watches are streams and not bound by it.
        self.client = aetcd.Client(host=host, port=self.port, timeout=self.timeout_s,
                                   options=dict(_CHANNEL_OPTIONS))
        self._watches: set[_EtcdWatch] = set()

    def _k(self, key: str, *, allow_empty: bool = False) -> bytes:
        return (self.prefix + check_key(key, allow_empty=allow_empty)).encode()

    def _entry(self, kv: Any) -> Entry:
        key = kv.key.decode()[len(self.prefix):]
        return Entry(key, bytes(kv.value), kv.version, kv.mod_revision, kv.lease)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        k, v = self._k(key), check_value(value)
        with _translated():
            return int((await self.client.put(k, v, lease=lease or 0)).header.revision)

    async def get(self, key: str) -> Entry | None:
        k = self._k(key)
        with _translated():
            got = await self.client.get(k)
        return None if got is None else self._entry(got)

    async def get_prefix(self, prefix: str) -> list[Entry]:
        p = self._k(prefix, allow_empty=True)
        with _translated():
            found = await self.client.get_prefix(p, sort_target="key", sort_order="ascend")
        return [self._entry(kv) for kv in found]

    async def delete(self, key: str) -> bool:
        k = self._k(key)
        with _translated():
            return (await self.client.delete(k)) is not None

    async def delete_prefix(self, prefix: str) -> int:
        p = self._k(prefix, allow_empty=True)
        with _translated():
            return int((await self.client.delete_prefix(p)).deleted)

    async def _txn(self, compare: list[Any], success: list[Any]) -> bool:
        with _translated():
            ok, _ = await self.client.transaction(compare=compare, success=success, failure=[])
        return bool(ok)

    def _compares(self, k: bytes, expected_value: bytes | None, expected_version: int | None) -> list[Any]:
        if expected_value is None and expected_version is None:
            raise ValueError("compare-and-swap needs expected_value and/or expected_version")
        t = self.client.transactions
        # version > 0: an absent key never matches, even against an expected empty value.
        compares = [t.version(k) > 0]
        if expected_value is not None:
            compares.append(t.value(k) == check_value(expected_value))
        if expected_version is not None:
            if isinstance(expected_version, bool) or not isinstance(expected_version, int):
                raise TypeError(f"expected_version must be an int, got {type(expected_version).__name__}")
            compares.append(t.version(k) == expected_version)
        return compares

    async def create(self, key: str, value: bytes, lease: int | None = None) -> bool:
        k, v = self._k(key), check_value(value)
        t = self.client.transactions
        return await self._txn([t.version(k) == 0], [t.put(k, v, lease=lease or 0)])

    async def compare_and_swap(self, key: str, value: bytes, *, expected_value: bytes | None = None,
                               expected_version: int | None = None,
                               lease: int | None = None) -> bool:
        k, v = self._k(key), check_value(value)
        compares = self._compares(k, expected_value, expected_version)
        return await self._txn(compares, [self.client.transactions.put(k, v, lease=lease or 0)])

    async def compare_and_delete(self, key: str, *, expected_value: bytes | None = None,
                                 expected_version: int | None = None) -> bool:
        k = self._k(key)
        compares = self._compares(k, expected_value, expected_version)
        return await self._txn(compares, [self.client.transactions.delete(k)])

    async def grant_lease(self, ttl_s: float) -> int:
        ttl = check_ttl(ttl_s)
        with _translated():
            # etcd leases are whole seconds (and at least its minimum TTL, ~2 s).
            lease = await self.client.lease(max(1, int(-(-ttl // 1))))
        return int(lease.id)

    async def refresh_lease(self, lease: int) -> None:
        with _translated():
            reply = await self.client.refresh_lease(lease)
        # etcd answers a keep-alive for an unknown lease with TTL 0 rather than an error.
        if reply is None or reply.TTL <= 0:
            raise LeaseNotFound(f"lease {lease:x} not found (expired or revoked)")

    async def lease_ttl(self, lease: int) -> tuple[float, float] | None:
        with _translated():
            reply = await self.client.get_lease_info(lease, keys=False)
        # an expired or unknown lease: TTL -1 (LeaseTimeToLive answers rather than fails)
        if reply is None or reply.TTL < 0:
            return None
        return float(reply.grantedTTL), float(reply.TTL)

    async def revoke_lease(self, lease: int) -> bool:
        try:
            with _translated():
                await self.client.revoke_lease(lease)
        except LeaseNotFound:
            return False
        return True

    def watch_prefix(self, prefix: str) -> Watch:
        watch = _EtcdWatch(self, self._k(prefix, allow_empty=True))
        self._watches.add(watch)
        return watch

    async def close(self) -> None:
        for watch in list(self._watches):
            await watch.cancel()
        self._watches.clear()
        with contextlib.suppress(Exception):
            await self.client.close()

