"""The REST API against a real local cluster: the cluster tests' bounded cluster
(tests/integration/cluster/cluster_run.py, its one home) is imported from there."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
