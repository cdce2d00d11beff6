"""``tp.connect``: where a cluster session connects (arguments, environment, or the run
directory of ``triplane up``), and ``tp.disconnect``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from triplane.sdk.remote_errors import RemoteError

if TYPE_CHECKING:
    import httpx

    from triplane.sdk.remote import RemoteSession

__all__ = ["LocalCluster", "connect", "disconnect", "resolve_target", "set_local_cluster_lookup"]

class LocalCluster(NamedTuple):
    """What the run directory of ``triplane up`` records: the cluster's URL (None when
    none is recorded) and token, and the directory's path (for error messages)."""

    url: str | None
    token: str | None
    where: str


# Reads the run directory. The launcher owns it and sits above the SDK, so the top of the
# package installs the lookup (triplane/embedded.py); without one, no cluster is recorded.
_local_cluster: Callable[[str | os.PathLike[str] | None], LocalCluster] | None = None


def set_local_cluster_lookup(lookup: Callable[[str | os.PathLike[str] | None], LocalCluster]) -> None:
    """Install what :func:`resolve_target` asks for the cluster of ``triplane up``."""
    global _local_cluster
    _local_cluster = lookup


def _recorded(home: str | os.PathLike[str] | None) -> LocalCluster:
    if _local_cluster is None:
        return LocalCluster(None, None, "the run directory (no lookup installed)")
    return _local_cluster(home)


def resolve_target(url: str | None = None, token: str | None = None,
                   home: str | os.PathLike[str] | None = None) -> tuple[str, str | None]:
    """Where to connect: the arguments, else ``TRIPLANE_URL`` / ``TRIPLANE_TOKEN``, else the
    run directory of ``triplane up`` (``home``, ``TRIPLANE_HOME``, default ``~/.triplane``).
    Raises :class:`RemoteError` naming all three places when none gives a URL."""
    url = url or os.environ.get("TRIPLANE_URL") or None
    token = token or os.environ.get("TRIPLANE_TOKEN") or None
    if url is None:
        found = _recorded(home)
        if found.url is None:
            raise RemoteError(f"no cluster to connect to: pass tp.connect(url, token), set TRIPLANE_URL, "
                              f"or start one with `triplane up` (nothing found in {found.where})")
        url = found.url
        token = token or found.token
    elif token is None:
        found = _recorded(home)
        if found.url is not None and found.url.rstrip("/") == url.rstrip("/"):
            token = found.token
    return url, token


def disconnect() -> None:
    """Release everything the current cluster session holds (its uploads and jobs, on the
    scheduler and the executors) and go back to the embedded session. Values kept on the
    cluster that Tensors still hold (parameters, optimiser state) are fetched first, so
    the model goes on in-process. No-op when not connected."""
    from triplane.sdk.session import set_default_session

    prev = set_default_session(None)
    from triplane.sdk.remote import RemoteSession

    if isinstance(prev, RemoteSession):
        prev.close(download=True)
    else:
        set_default_session(prev)


def connect(url: str | None = None, token: str | None = None, *,
            home: str | os.PathLike[str] | Path | None = None,
            transport: httpx.BaseTransport | None = None, check: bool = True,
            **options: Any) -> RemoteSession:
    """Make ``.numpy()`` run on a cluster: sets (and returns) the process's default session.

    With no arguments, uses ``TRIPLANE_URL`` / ``TRIPLANE_TOKEN``, else the cluster that
    ``triplane up`` recorded in its run directory. With ``check`` (default) the scheduler
    is asked for its nodes at once, so a wrong URL or token fails here with a clear
    :class:`RemoteError` instead of at the first ``.numpy()``. ``options`` go to
    :class:`RemoteSession`. ``set_default_session(None)`` (triplane.sdk.session) goes back
    to the embedded session.
    """
    from triplane.sdk.remote import RemoteSession
    from triplane.sdk.session import set_default_session

    url, token = resolve_target(url, token, home)
    session = RemoteSession(url, token, transport, **options)
    if check:
        try:
            session.nodes()
        except BaseException:
            session.close()
            raise
    set_default_session(session)
    return session
