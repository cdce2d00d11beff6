"""Shared test settings."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# CI machines are small and shared: no per-example deadlines, a bounded example count.
settings.register_profile("ci", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=30)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
