"""The harness itself: leftovers of a dead run are removed, a live run's are kept."""

from __future__ import annotations

import os

import netns
import pytest


def _names() -> set[str]:
    return {line.split()[0] for line in netns._ip("netns", "list").stdout.splitlines() if line.split()}


def test_cleanup_removes_only_the_namespaces_of_dead_runs() -> None:
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    dead = f"{netns.PREFIX}999999999x1-sw"  # above any pid_max: its owner cannot be alive
    live = f"{netns.PREFIX}{os.getpid()}x1-leftover-test"
    netns._ip("netns", "add", dead)
    netns._ip("netns", "add", live)
    try:
        removed = netns.cleanup_leftovers()
        assert dead in removed and dead not in _names()
        assert live in _names() and live not in removed
    finally:
        netns._ip("netns", "del", dead, check=False)
        netns._ip("netns", "del", live, check=False)
