"""Fixtures of the tiling tests: fresh seeds, and running a graph (tiled or not) on the
numpy engine through executor/local.run_plan, the way the embedded runtime does."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from triplane.engines.op.numpy_engine import NumpyEngine
from triplane.executor.local import run_plan
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.scheduler.compiler.memory import plan_memory
from triplane.scheduler.compiler.pipeline import Plan

Runner = Callable[[Graph, Mapping[str, np.ndarray]], dict[str, np.ndarray]]


@pytest.fixture
def seed() -> int:
    """A fresh seed per test (below 2**53 so it can seed random ops too); tests put it in
    their failure messages so a failure can be replayed."""
    return int(np.random.SeedSequence().entropy) % (1 << 53)


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture
def run() -> Runner:
    """Validate ``graph`` (a tile graph must be ordinary valid IR) and run it as is."""
    engine = NumpyEngine()

    def go(graph: Graph, bindings: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = validate(graph)
        return run_plan(Plan(g, plan_memory(g), g), bindings, engine)

    return go
