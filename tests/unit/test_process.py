"""Start-up of the long-running processes (triplane/process.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from triplane.process import limit_malloc_arenas

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def test_a_malloc_arena_max_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert limit_malloc_arenas() is False


@pytest.mark.skipif(not GLIBC, reason="mallopt(M_ARENA_MAX) is glibc's")
def test_the_arenas_are_capped_so_threads_share_them() -> None:
    """In a fresh process: with the cap, 16 live threads that each allocate share 2 arenas
    (glibc's malloc_info lists one <heap> per arena); without, they get more."""
    probe = r"""
import ctypes, sys, threading
from triplane.process import limit_malloc_arenas
capped = sys.argv[1] == "1" and limit_malloc_arenas()
gate = threading.Barrier(16)
def work():
    gate.wait()  # all alive at once (an exited thread's arena is reused)
    bufs = [bytearray(4096) for _ in range(500)]  # past pymalloc: glibc's malloc
    gate.wait()
threads = [threading.Thread(target=work) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.open_memstream.restype = ctypes.c_void_p
buf, size = ctypes.c_char_p(), ctypes.c_size_t()
f = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
libc.malloc_info(0, ctypes.c_void_p(f)); libc.fclose(ctypes.c_void_p(f))
print(int(capped), buf.value.decode().count("<heap nr="))
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "MALLOC_ARENA_MAX"}
    capped = subprocess.run([sys.executable, "-c", probe, "1"], capture_output=True, text=True, env=env,
                            timeout=60, check=True).stdout.split()
    free = subprocess.run([sys.executable, "-c", probe, "0"], capture_output=True, text=True, env=env,
                          timeout=60, check=True).stdout.split()
    assert capped[0] == "1" and int(capped[1]) <= 2, capped
    assert int(free[1]) > 2, free
