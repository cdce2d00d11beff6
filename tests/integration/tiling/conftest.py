"""Shared by the tiling cluster tests: the cluster tests' bounded, always-torn-down
launcher (tests/ has no packages, so it is loaded from its file)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def running_cluster() -> Callable[..., Any]:
    path = Path(__file__).resolve().parents[1] / "cluster" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_tiling_cluster_helpers", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.running_cluster
