"""Helpers of the SDK tests: the Go toolchain's environment and runs in sdk/go, and the
digits data set written as the Go and JS examples read it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
GO_SDK = ROOT / "sdk" / "go"


def go_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The user's environment for the go tool, with a build cache it can write (a home
    without ~/.cache gets one under ``tmp``) and ``extra`` set."""
    env = dict(os.environ)
    if "GOCACHE" not in env and not os.access(Path.home(), os.W_OK):
        env["GOCACHE"] = str(tmp / "gocache")
    env.update(extra)
    return env


def run_go(go: str, *args: str, env: dict[str, str],
           timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """``go ARGS`` in sdk/go."""
    return subprocess.run([go, *args], cwd=GO_SDK, env=env, capture_output=True, text=True, timeout=timeout)


def write_digits(path: Path) -> Path:
    """scikit-learn's digits (bundled with it: no download) as ``spec.json`` and raw
    little-endian ``x.bin`` (float32 (1797, 64), scaled to [0, 1]) and ``y.bin`` (int64)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int64)
    path.mkdir(parents=True, exist_ok=True)
    (path / "x.bin").write_bytes(x.tobytes())
    (path / "y.bin").write_bytes(y.tobytes())
    (path / "spec.json").write_text(json.dumps({"inputs": {
        "x": {"shape": list(x.shape), "dtype": "float32", "file": "x.bin"},
        "y": {"shape": list(y.shape), "dtype": "int64", "file": "y.bin"}}}))
    return path
