"""Start and stop a local single-member etcd: used by the e2e tests and by ``triplane up``.

It listens on 127.0.0.1 by default (``host``: another address of this host, e.g. inside a
network namespace of the multi-host tests), on free ports, with its own data directory. The binary is
looked up on ``PATH`` and then in the usual Debian places; Debian/Ubuntu ship it in the
``etcd-server`` package (``apt-get install -y etcd-server``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["ETCD_APT_PACKAGE", "EtcdServer", "find_etcd_binary", "free_port"]

ETCD_APT_PACKAGE = "etcd-server"
_CANDIDATES = ("/usr/bin/etcd", "/usr/local/bin/etcd", "/usr/sbin/etcd", "/opt/etcd/etcd", "/snap/bin/etcd")


def find_etcd_binary() -> str | None:
    """The path of an ``etcd`` executable (``$TRIPLANE_ETCD``, PATH, Debian paths), or None."""
    explicit = os.environ.get("TRIPLANE_ETCD")
    if explicit and os.access(explicit, os.X_OK):
        return explicit
    found = shutil.which("etcd")
    if found:
        return found
    return next((c for c in _CANDIDATES if os.access(c, os.X_OK)), None)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    """One etcd process. ``start()`` returns once ``/health`` answers; ``stop()`` ends it.

    The ports stay the same across :meth:`restart`, so connected clients reconnect to it.
    ``restart(wipe=True)`` also deletes the data directory: every lease and key is lost,
    as after replacing a broken etcd, which is what re-registration must survive.
    """

    def __init__(self, data_dir: str | Path, *, binary: str | None = None,
                 client_port: int | None = None, peer_port: int | None = None,
                 host: str = "127.0.0.1") -> None:
        path = binary or find_etcd_binary()
        if path is None:
            raise FileNotFoundError(f"no etcd binary found (install the Debian package {ETCD_APT_PACKAGE!r})")
        self.binary = path
        self.host = host
        self.data_dir = Path(data_dir)
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The registry URL for :func:`triplane.registry.connect_registry`."""
        return f"etcd://{self.host}:{self.client_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def _argv(self) -> list[str]:
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        return [self.binary, "--name", "triplane", "--data-dir", str(self.data_dir / "member-data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"triplane={peer}", "--initial-cluster-state", "new",
                "--log-level", "warn"]

    def start(self, timeout_s: float = 20.0) -> None:
        """Launch etcd and wait for health; ``TimeoutError`` (process stopped) if it never is."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log_path}")
            if self.healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"etcd not healthy after {timeout_s} s; see {self.log_path}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.client_port}/health", timeout=1) as resp:
                return resp.status == 200 and b'"true"' in resp.read()
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)

    def restart(self, *, wipe: bool = False, down_s: float = 0.0) -> None:
        """Stop, optionally delete all data, stay down ``down_s`` seconds, start again."""
        self.stop()
        if wipe:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.data_dir / "member-data")
        if down_s > 0:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
