"""Running a bench/ script from a test (a helper module, not tests): in its own process
group, killed whole if it overruns its time bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def run_bench(script: Path, args: list[str], tmp_path: Path, timeout: float,
              keep_home: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``args``; results go under ``tmp_path``. With ``keep_home`` the
    triplane run directory stays under ``tmp_path`` too (so a test can read its pids)."""
    env = dict(os.environ)
    if keep_home:  # not for Ray: its socket paths under a long TMPDIR exceed AF_UNIX's 107 bytes
        env |= {"TMPDIR": str(tmp_path), "BENCH_KEEP_HOME": "1"}
    env.pop("TRIPLANE_URL", None)
    env.pop("TRIPLANE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, str(script), "--results-dir", str(tmp_path / "results"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{script.name} overran {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
