"""Tiling: cutting a compiled graph's tensors into tiles sized for the cluster.

:func:`tile_graph` (the pass) rewrites a graph into a tile graph by the split rules the
op table declares (:mod:`.rules`, :mod:`.shape_rules`); :func:`plan_sizes` derives the
tile sizes from :class:`ClusterFigures`. See docs/tiling.md.
"""

from triplane.scheduler.compiler.tiling.grid import Region, TileGrid
from triplane.scheduler.compiler.tiling.sizing import ClusterFigures, NodeFigures, TileSizes, plan_sizes
from triplane.scheduler.compiler.tiling.tiler import TiledGraph, tile_graph

__all__ = ["ClusterFigures", "NodeFigures", "Region", "TileGrid", "TileSizes", "TiledGraph",
           "plan_sizes", "tile_graph"]
