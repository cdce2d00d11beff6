"""Fixtures shared by the op tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def seed() -> int:
    """A fresh seed per test (below 2**53, so it can also seed random ops), reported in
    assertion messages so a failure can be replayed."""
    return int(np.random.SeedSequence().entropy) % (1 << 53)


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
