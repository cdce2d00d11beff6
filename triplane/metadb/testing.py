"""A throwaway PostgreSQL server for tests, CI and local experiments.

``PostgresServer`` makes a temporary cluster with ``initdb`` (trust auth, 127.0.0.1 only), starts
it with ``pg_ctl`` on a free port, hands out fresh databases, and removes everything on
``stop()``. PostgreSQL refuses to run as root, so as root the binaries run as the ``postgres``
OS user (created by Debian's ``postgresql`` package) via ``runuser``.

``find_pg_bindir()`` looks where Debian installs the server (``/usr/lib/postgresql/<ver>/bin``,
newest first), then on PATH. Tests skip with ``MISSING_REASON`` when it finds nothing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

MISSING_REASON = ("PostgreSQL server binaries not found (install the Debian package 'postgresql': "
                  "apt-get install -y postgresql)")


def find_pg_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                        key=lambda p: _version_key(p.parent.name), reverse=True)
    found = shutil.which("pg_ctl")
    if found:
        candidates.append(Path(found).resolve().parent)
    for d in candidates:
        if all((d / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split(".") if p.isdigit())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A temporary PostgreSQL cluster on 127.0.0.1; use as a context manager.

    ``start()`` raises RuntimeError (with the server log) if the server does not come up
    within ``timeout`` seconds; ``stop()`` is safe to call twice and always removes the
    directory.
    """

    def __init__(self, bindir: Path, *, timeout: float = 60.0, host: str = "127.0.0.1",
                 port: int = 0, trust_network: str | None = None) -> None:
        """``host``/``port``: where it listens (0: a free port); ``trust_network``: a CIDR whose
        clients are let in without a password too (the multi-host tests' private network)."""
        self.bindir = bindir
        self.timeout = timeout
        self.host = host
        self.trust_network = trust_network
        self._port = port
        self.port = 0
        self.root: Path | None = None
        self._user: str | None = None

    def _run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout or self.timeout,
                              check=False)

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no 'postgres' OS user to run the "
                                   "server as (the Debian 'postgresql' package creates it)") from None
            self._user = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="triplane-pg-"))
        if self._user is not None:
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        data, sock = self.root / "data", self.root / "sock"
        sock.mkdir()
        if self._user is not None:
            os.chown(sock, owner.pw_uid, owner.pw_gid)
        r = self._run("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                      "--no-sync", "--no-locale")
        if r.returncode != 0:
            self.stop()
            raise RuntimeError(f"initdb failed: {r.stderr.strip() or r.stdout.strip()}")
        if self.trust_network is not None:
            with open(data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {self.trust_network} trust\n")
        self.port = self._port or free_port()
        # Durability is irrelevant for a test cluster; without fsync it starts and writes faster.
        opts = (f"-h {self.host} -p {self.port} -k {sock} -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c max_connections=50")
        r = self._run("pg_ctl", "-D", str(data), "-l", str(self.root / "server.log"), "-o", opts,
                      "-w", "-t", str(int(self.timeout)), "start")
        if r.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace")[-2000:]
            self.stop()
            raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()}\n{log}")
        return self

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh, empty database and return its URL."""
        import psycopg  # only needed with a server running

        name = name or "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(f"host={self.host} port={self.port} user=postgres dbname=postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # name is ours: letters, digits, _
        return self.url(name)

    def stop(self) -> None:
        if self.root is None:
            return
        if (self.root / "data" / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "-t", "30", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
