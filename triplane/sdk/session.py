"""Where graphs run: the session.

A session is anything with ``evaluate(outputs) -> list[np.ndarray]``. The default one is
made by the factory the top of the package installs (``triplane/embedded.py``, wired in
``triplane/__init__.py``): the embedded session, which compiles and runs in this process.
The SDK does not import the compiler or the executor itself; they sit beside it, not
below. ``tp.connect`` swaps in a session that submits to a cluster (``remote.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from triplane.proto.errors import KernelError

if TYPE_CHECKING:
    from triplane.sdk.tensor import Tensor


def locate_kernel_error(e: KernelError, rename: dict[str, str], tensors: dict[str, Tensor]) -> KernelError:
    """Name the user's line that made the node a kernel failed on."""
    back = {v: k for k, v in rename.items()}
    t = tensors.get(back.get(e.node or "", ""))
    where = f" (made at {t._where})" if t is not None and t._where else ""
    msg, prefix = str(e), f"node {e.node!r} ({e.op}): "
    if e.node and msg.startswith(prefix):  # KernelError adds it again: say it once
        msg = msg[len(prefix):]
    return KernelError(f"{msg}{where}", node=e.node, op=e.op, kind=e.kind)


_local = threading.local()
_default: Any | None = None
_factory: Callable[[], Any] | None = None


def set_session_factory(factory: Callable[[], Any]) -> None:
    """What makes the process default session when none is set (``triplane/__init__.py``
    installs the embedded session's class)."""
    global _factory
    _factory = factory


def current_session() -> Any:
    """The session of this thread (set by ``use_session``), else the process default.
    Raises RuntimeError when no default was set and no factory installed (only possible
    when the SDK is used without its package's ``__init__``)."""
    s = getattr(_local, "session", None)
    if s is not None:
        return s
    global _default
    if _default is None:
        if _factory is None:
            raise RuntimeError("no session to run on: nothing installed a session factory "
                               "(import triplane, or call set_session_factory)")
        _default = _factory()
    return _default


def set_default_session(session: Any | None) -> Any:
    """Make ``session`` the process default (``None``: a fresh embedded session on next
    use); returns the previous default. ``tp.connect`` uses this."""
    global _default
    prev, _default = _default, session
    return prev


class use_session:
    """``with use_session(s): ...`` runs graphs on ``s`` in this thread."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def __enter__(self) -> Any:
        self._prev = getattr(_local, "session", None)
        _local.session = self.session
        return self.session

    def __exit__(self, *exc: object) -> None:
        _local.session = self._prev
