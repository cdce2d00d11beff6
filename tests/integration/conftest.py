"""Fixtures shared by the integration tests: ``redis_url``, a throwaway redis-server
(127.0.0.1, a free port, no persistence) for the redis memory engine and the redis
persistence target; the test is skipped, with the reason, where redis-server or redis-py
is missing (.ci/run installs both)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(tmp_path) -> Iterator[str]:
    """Start ``redis-server`` (skip the test with the reason if it or redis-py is missing);
    yield its URL; stop it."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (.ci/run installs it with apt-get)")
    redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'triplane[cluster]')")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a redis-server started for this test session."""
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url
