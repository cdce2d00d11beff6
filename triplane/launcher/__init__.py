"""Local clusters: ``triplane up`` / ``status`` / ``down`` and :class:`LocalCluster`.

See docs/cluster.md. The run directory layout is in :mod:`triplane.launcher.rundir`.
"""

from triplane.launcher.cluster import ClusterConfig, LaunchError, LocalCluster
from triplane.launcher.commands import cluster_status, down, up
from triplane.launcher.rundir import RunDir, default_home

__all__ = ["ClusterConfig", "LaunchError", "LocalCluster", "RunDir", "cluster_status", "default_home",
           "down", "up"]
