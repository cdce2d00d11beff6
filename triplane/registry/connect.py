"""Pick a registry backend from a URL.

    memory://            a private in-memory store (embedded mode, tests)
    memory://NAME        a process-wide named in-memory store: every connect with NAME shares it
    etcd://HOST[:PORT][/PREFIX/]   etcd v3 (port 2379 by default); a path sets the key prefix
    http[s]://HOST:PORT  the registry a scheduler serves (with the node credential: ``token=``,
                         or derived from ``secret=`` or $TRIPLANE_SECRET)

A ``prefix`` argument overrides the URL's. Schemes come from a dict of built-ins, then from
the ``triplane.registry.backends`` entry-point group (a callable ``(url, prefix) -> backend``),
so a vendor can add one; an unknown scheme lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from urllib.parse import SplitResult, urlsplit

from triplane.registry.backend import DEFAULT_PREFIX, RegistryBackend, check_key
from triplane.registry.credential import node_credential, node_credential_from_env
from triplane.registry.memory import MemoryBackend, MemoryStore

__all__ = ["connect_registry", "known_schemes"]

_named_stores: dict[str, MemoryStore] = {}

Factory = Callable[[SplitResult, str | None], RegistryBackend]


def _memory(url: SplitResult, prefix: str | None) -> RegistryBackend:
    name = url.netloc + url.path
    if not name:
        return MemoryBackend(prefix=prefix or DEFAULT_PREFIX)
    store = _named_stores.setdefault(name, MemoryStore())
    return MemoryBackend(store, prefix=prefix or DEFAULT_PREFIX)


def _etcd(url: SplitResult, prefix: str | None) -> RegistryBackend:
    from triplane.registry.etcd import EtcdBackend  # aetcd is optional: import on use

    try:
        port = url.port or 2379
    except ValueError as exc:
        raise ValueError(f"bad port in registry URL {url.geturl()!r}") from exc
    if not url.hostname:
        raise ValueError(f"registry URL {url.geturl()!r} names no host (etcd://HOST:PORT)")
    path_prefix = url.path if url.path not in ("", "/") else None
    if path_prefix is not None and not path_prefix.endswith("/"):
        path_prefix += "/"
    return EtcdBackend(url.hostname, port, prefix=prefix or path_prefix or DEFAULT_PREFIX)


def _http(url: SplitResult, prefix: str | None, token: str | None = None,
          secret: bytes | str | None = None) -> RegistryBackend:
    from triplane.registry.http import HttpBackend  # httpx is optional: import on use

    if token is None:
        token = node_credential(secret) if secret else node_credential_from_env()
    return HttpBackend(url.geturl(), token or "", prefix=prefix or "")


_BUILTIN: dict[str, Factory] = {"memory": _memory, "etcd": _etcd, "http": _http, "https": _http}


def _plugins() -> dict[str, Factory]:
    return {ep.name: ep.load() for ep in entry_points(group="triplane.registry.backends")}


def known_schemes() -> list[str]:
    """Every scheme :func:`connect_registry` accepts (built-ins and installed plugins)."""
    return sorted({*_BUILTIN, *(ep.name for ep in entry_points(group="triplane.registry.backends"))})


def connect_registry(url: str, *, prefix: str | None = None, token: str | None = None,
                     secret: bytes | str | None = None) -> RegistryBackend:
    """A backend for ``url``. Raises ``ValueError`` for a malformed or unknown URL.

    ``http(s)://`` (a registry a scheduler serves) takes the node credential, not a client
    token: ``token`` if given, else derived from the cluster ``secret``, else from
    ``$TRIPLANE_SECRET`` (``triplane.registry.credential``). Other schemes ignore both, so
    a caller may always pass what it has.

    Connecting is lazy for etcd: a server that is down shows up as
    :class:`~triplane.registry.backend.RegistryUnavailable` on the first call.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"registry URL must look like SCHEME://..., got {url!r} "
                         f"(known schemes: {known_schemes()})")
    if prefix is not None:
        check_key(prefix, allow_empty=True)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    factory = _BUILTIN.get(scheme) or _plugins().get(scheme)
    if factory is None:
        raise ValueError(f"unknown registry scheme {scheme!r} in {url!r} (known schemes: {known_schemes()})")
    if factory is _http:
        return _http(parts, prefix, token, secret)
    return factory(parts, prefix)
