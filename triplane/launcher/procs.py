"""Background processes of a local cluster: start, check, stop.

Every process starts in its own session (``start_new_session``), so it outlives the
``triplane up`` that started it, ignores the terminal's Ctrl-C, and can be stopped as a
whole process group. Its stdout and stderr go to one log file.

Stopping is SIGTERM to the group, then SIGKILL for whatever is still there after a grace
period. It is idempotent and never signals a pid that has been reused by an unrelated
program: a pid is only ours if its command line still carries the marker we started it
with (Linux ``/proc``; elsewhere liveness alone is trusted).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["alive", "is_ours", "log_tail", "spawn", "stop_pids", "triplane_argv"]


def triplane_argv(*args: str) -> list[str]:
    """``python -m triplane ARGS`` with this interpreter (works without the console script)."""
    return [sys.executable, "-m", "triplane", *args]


PRIVATE_UMASK = 0o077  # what a cluster's processes create is their user's alone (0600 / 0700)


def spawn(argv: Sequence[str], log_path: Path,
          env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached, appending its output to ``log_path`` (created 0600). The
    process runs with umask 077, so the files it makes (tensors, the metadb) are private."""
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log:
        os.fchmod(fd, 0o600)
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=dict(env) if env is not None else None,
                                umask=PRIVATE_UMASK)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its parent's wait counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def is_ours(pid: int, marker: str = "triplane") -> bool:
    """``pid`` is alive and (where /proc tells) its command line contains ``marker``."""
    if not alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return True
    return marker in cmdline


def _signal_group(pid: int, sig: int) -> None:
    # Each process leads its own session, so its group id is its pid; fall back to the
    # pid alone if the group is gone (the leader changed group, or was already reaped).
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_pids(pids: Iterable[int], grace_s: float = 5.0, marker: str = "triplane",
              children: Iterable[subprocess.Popen[bytes]] = ()) -> list[int]:
    """SIGTERM each of ``pids`` that is ours, SIGKILL survivors after ``grace_s``; the pids
    that had to be killed. ``children`` (our own Popen objects) are reaped, so they do not
    linger as zombies."""
    targets = [p for p in dict.fromkeys(pids) if is_ours(p, marker)]
    for p in targets:
        _signal_group(p, signal.SIGTERM)
    popen = {c.pid: c for c in children}
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for c in popen.values():
            c.poll()
        if not any(alive(p) for p in targets):
            break
        time.sleep(0.05)
    killed = [p for p in targets if alive(p)]
    for p in killed:
        _signal_group(p, signal.SIGKILL)
    for c in popen.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.wait(5.0)
    deadline = time.monotonic() + 5.0
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
