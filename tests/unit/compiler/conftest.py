"""Shared by the compiler tests."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from triplane.engines.registry import get_op_engine
from triplane.executor.local import run_plan


@pytest.fixture
def peak_bytes() -> Callable[[object, dict[str, np.ndarray]], int]:
    """The peak traced allocation of running a plan on the numpy engine (after a warm-up
    run, so that imports and caches do not count)."""

    def peak(plan: object, data: dict[str, np.ndarray]) -> int:
        eng = get_op_engine("numpy")
        run_plan(plan, data, eng)
        tracemalloc.start()
        try:
            run_plan(plan, data, eng)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    return peak
