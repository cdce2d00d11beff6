"""The run directory of a local cluster (``TRIPLANE_HOME``, default ``~/.triplane``).

Layout (docs/cluster.md)::

    cluster.json     what ``triplane up`` started: url, grpc (host:port), registry, db, pids, logs
    token            the admin bearer token of the REST API, fresh for each ``up``
    tokens.json      more client tokens (admin, submit, read): names, roles, SHA-256 hashes
    secret           the cluster secret that signs packets and data-port requests (0600)
    logs/            one log file per process: scheduler.log, executor-<i>.log, etcd.log
    tensors/         uploaded tensors, kept by the scheduler as .npy (no pickle)
    etcd/            the data of an ``--etcd embedded`` etcd
    up.lock          held (flock) while ``up`` or ``down`` runs, so two never interleave

``cluster.json`` is written atomically (temp file + rename) and only after every process
is ready, so a reader sees either no cluster or a complete record. Readers treat a
malformed file as "no cluster" and say so instead of crashing.

Everything in the directory is its user's alone: ``secure()`` makes the directory and
everything under it 0700 (directories) / 0600 (files), whether it existed before or not,
and the processes ``up`` starts run with umask 077, so what they create later is too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["RunDir", "default_home"]


def default_home() -> Path:
    """``$TRIPLANE_HOME``, else ``~/.triplane``."""
    env = os.environ.get("TRIPLANE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".triplane"


class RunDir:
    """Paths and small files of one run directory. Creating the object touches nothing."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_home()

    @property
    def cluster_file(self) -> Path:
        return self.path / "cluster.json"

    @property
    def token_file(self) -> Path:
        return self.path / "token"

    @property
    def tokens_file(self) -> Path:
        return self.path / "tokens.json"

    @property
    def secret_file(self) -> Path:
        return self.path / "secret"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def tensors(self) -> Path:
        return self.path / "tensors"

    @property
    def etcd_data(self) -> Path:
        return self.path / "etcd"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def create(self) -> None:
        """Make the directory tree and make all of it private to this user (``secure``)."""
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.logs.mkdir(exist_ok=True, mode=0o700)
        self.tensors.mkdir(exist_ok=True, mode=0o700)
        self.secure()

    def secure(self) -> None:
        """chmod the run directory and everything under it to 0700 (directories) and 0600
        (files): a directory that existed before (mode 0755, world-readable uploads, logs
        and metadb) is closed too. Symlinks are left alone (never followed)."""
        _private(self.path, 0o700)
        for root, dirs, files in os.walk(self.path):
            for name in dirs:
                _private(Path(root) / name, 0o700)
            for name in files:
                _private(Path(root) / name, 0o600)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run dir's lock (blocks while another ``up``/``down`` holds it)."""
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path / "up.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    # --- secrets ---------------------------------------------------------------------------

    def new_secrets(self) -> tuple[str, str]:
        """Write a fresh token and cluster secret (0600, replacing old ones); return both."""
        token, secret = secrets.token_urlsafe(32), secrets.token_hex(32)
        for path, value in ((self.token_file, token), (self.secret_file, secret)):
            _write_private(path, value + "\n")
        return token, secret

    def read_token(self) -> str | None:
        try:
            return self.token_file.read_text().strip() or None
        except OSError:
            return None

    # --- cluster.json ----------------------------------------------------------------------

    def read_cluster(self) -> dict[str, Any] | None:
        """The recorded cluster, or None when there is none (or the file is malformed)."""
        try:
            info = json.loads(self.cluster_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or not isinstance(info.get("url"), str):
            return None
        return info

    def write_cluster(self, info: dict[str, Any]) -> None:
        _write_private(self.cluster_file, json.dumps(info, indent=2, sort_keys=True) + "\n")

    def clear_cluster(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.cluster_file.unlink()


def _private(path: Path, mode: int) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
        return
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, mode)


def _write_private(path: Path, text: str) -> None:
    """Atomically replace ``path`` with ``text``, readable by this user only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)  # O_CREAT's mode is filtered by the umask; be explicit
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
