"""The tiling pass: a compiled graph -> a tile graph.

:func:`tile_graph` rewrites a validated graph into an ordinary IR graph whose nodes work
on tiles: the same ops applied to tile-shaped tensors (by each op's split rule,
:mod:`.rules`), ``add``/``maximum``/... trees combining partial results, and ``slice`` /
``concat`` regrouping tiles where a consumer needs a region its producer did not cut
that way. One node is one task, so the distributed runtime and the in-process runner
(executor/local.run_plan) run it unchanged.

Per node, in topological order:

1. the rule gives the axes it may be cut along; the cut of each axis is chosen: the
   explicit one if :class:`~.sizing.TileSizes` names the node; else the producers' cuts
   where the axis aligns with an input dimension that is already cut (so tiles line up
   and nothing moves); then each interval is halved along the axis that shrinks the
   largest task most (output axes before contraction axes) until the task's inputs plus
   output fit ``max_task_bytes`` (LimitError if nothing can shrink it), then further while
   there are fewer than ``min_tasks`` tasks, the node's predicted span on the cluster
   drops (compute, communication and combine tree: :meth:`_Tiler._span`) and a task's
   compute stays ``ratio`` times its fixed costs. A graph totalling at most
   ``unsplit_bytes`` is not cut at all.
2. each output cell becomes a task (several, plus a combine tree and ``finish``, when a
   contraction axis is cut) reading input regions through :meth:`_Tiler.region_of`: the
   producer's tile when the region is one, a ``slice`` of the one tile holding it, or
   slices of the overlapping tiles joined by nested ``concat`` s (ordered to need the
   fewest) -- only the bytes of the region move, never a whole large tensor unless the
   consumer needs it whole. Sources that can make any region (``input`` slices, ``full``,
   ``eye``, random ops) make the requested region directly instead -- except an input
   whose value is already held in tiles (``TileSizes.held``): it is read as a tiled
   producer is, each of its tiles a region of the input (the region tiles a ref's parts
   are bound to), and its consumers align their cuts with them.

Graph outputs become their tiles (row-major per output): a fetch assembles them
(:meth:`TiledGraph.assemble`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from triplane.proto import optable
from triplane.proto.builder import Builder
from triplane.proto.errors import LimitError
from triplane.proto.ir import Graph, Node, TensorType
from triplane.scheduler.compiler.memory import plan_memory
from triplane.scheduler.compiler.tiling.grid import (
    Cuts,
    Region,
    TileGrid,
    check_cuts,
    even_cuts,
    full_region,
    refine,
    region_shape,
)
from triplane.scheduler.compiler.tiling.rules import space_of
from triplane.scheduler.compiler.tiling.sizing import TileSizes, format_bytes
from triplane.scheduler.compiler.tiling.space import Space, Task

__all__ = ["TiledGraph", "tile_graph"]

# Roles of tile-graph nodes (TiledGraph.roles): a tile of a tensor's grid; a partial
# result of a contraction-split task; a node of a combine tree (and finish); a slice or
# concat regrouping tiles; a region made directly by a source.
ROLES = ("tile", "partial", "combine", "regroup", "source")


@dataclass(frozen=True)
class TiledGraph:
    """The tile graph and how it maps back to the original.

    ``grids``: original node -> its TileGrid (every node except sources that are not
    outputs: those are made region by region, on demand; see ``pieces``). ``origin``:
    tile node -> the original node it came from (a regroup's origin is the tensor it
    regroups). ``roles``: tile node -> one of :data:`ROLES`. ``pieces``: original node ->
    every ``(region, tile node)`` holding part of it."""

    graph: Graph
    grids: Mapping[str, TileGrid]
    origin: Mapping[str, str]
    roles: Mapping[str, str]
    pieces: Mapping[str, tuple[tuple[Region, str], ...]]

    def output_tiles(self, node: str) -> list[str]:
        grid = self.grids[node]
        return [grid.tiles[c] for c in grid.cells()]

    def assemble(self, node: str, values: Mapping[str, np.ndarray]) -> np.ndarray:
        """Original output ``node`` from its tiles' values (run_plan's result)."""
        return self.grids[node].assemble(values)


def tile_graph(graph: Graph, sizes: TileSizes | None = None) -> TiledGraph:
    """Tile a validated graph (see the module doc).

    Raises LimitError naming the tensor and the limit when a tensor, or the graph's peak
    memory, exceeds the cluster's total memory, or a task that cannot be cut further does
    not fit one node; ValueError when ``sizes.explicit`` names an axis a node does not have."""
    sizes = sizes or TileSizes()
    graph = graph.sorted()
    _check_total(graph, sizes)
    return _Tiler(graph, sizes).run()


def _check_total(graph: Graph, sizes: TileSizes) -> None:
    limit = sizes.total_bytes
    for nid, node in graph.nodes.items():
        if node.type.nbytes > limit:
            raise LimitError(f"tensor {node.type} needs {format_bytes(node.type.nbytes)}, more than the "
                             f"cluster's total memory of {format_bytes(limit)}", node=nid, op=node.op)
    plan = plan_memory(graph)
    if plan.peak_bytes <= limit:
        return
    live = 0
    for step in plan.steps:
        live += graph.nodes[step.node].type.nbytes
        if live > limit:
            node = graph.nodes[step.node]
            raise LimitError(f"computing it needs {format_bytes(live)} live at once (with the tensors "
                             f"still to be read), more than the cluster's total memory of "
                             f"{format_bytes(limit)}", node=step.node, op=node.op)
        live -= sum(graph.nodes[d].type.nbytes for d in step.free)


def _whole(node: Node, ins: Sequence[TensorType]) -> Space:
    return Space((), lambda r, p: Task(node.op, node.attrs, tuple((i, full_region(t.shape))
                                                                  for i, t in enumerate(ins))))


class _Tiler:
    def __init__(self, graph: Graph, sizes: TileSizes) -> None:
        self.g = graph
        self.sizes = sizes
        self.b = Builder(prefix="_t")
        self.taken = set(graph.nodes)
        self.spaces: dict[str, Space] = {}
        self.cuts: dict[str, dict[str, Cuts]] = {}
        self.grids: dict[str, TileGrid] = {}
        self.held: dict[str, TileGrid] = {}  # inputs held in tiles: their tiles made on demand
        self.memo: dict[tuple[str, Region], str] = {}
        self.origin: dict[str, str] = {}
        self.roles: dict[str, str] = {}
        self.pieces: dict[str, list[tuple[Region, str]]] = {}
        total = sum(n.type.nbytes for n in graph.nodes.values())
        self.cut_enabled = total > sizes.unsplit_bytes
        self.outputs = set(graph.outputs)

    # --- the walk -------------------------------------------------------------------------

    def run(self) -> TiledGraph:
        for nid in self.g.topo_order():
            node = self.g.nodes[nid]
            ins = [self.g.type_of(i) for i in node.inputs]
            space = space_of(node, ins, optable.get(node.op).split) or _whole(node, ins)
            self.spaces[nid] = space
            if node.op == "input":  # the uploaded tensor itself, whole; tiles slice it
                self.b.nodes[nid] = node
                self._note(nid, nid, "source", full_region(node.shape))
                bounds = self.sizes.held.get(nid)
                if bounds is not None and nid not in self.outputs:
                    self.held[nid] = TileGrid(tuple(node.shape), node.dtype,
                                              tuple(tuple(b) for b in bounds), {})
            if space.makes_regions and nid not in self.outputs:
                continue  # made region by region, as consumers ask
            self.cuts[nid] = self._choose(nid, node, ins, space)
            self._emit_grid(nid, node, ins, space)
        outs = list(dict.fromkeys(t for o in self.g.outputs for t in self._grid_tiles(o)))
        tiled = Graph(dict(self.b.nodes), tuple(outs)).sorted()
        return TiledGraph(tiled, dict(self.grids), dict(self.origin), dict(self.roles),
                          {k: tuple(v) for k, v in self.pieces.items()})

    def _grid_tiles(self, nid: str) -> list[str]:
        grid = self.grids[nid]
        return [grid.tiles[c] for c in grid.cells()]

    def _fresh(self, base: str) -> str:
        nid, n = base, 1
        while nid in self.taken or nid in self.b.nodes:
            n += 1
            nid = f"{base}'{n}"
        self.taken.add(nid)
        return nid

    def _note(self, tile: str, orig: str, role: str, region: Region | None = None) -> None:
        self.origin[tile] = orig
        self.roles[tile] = role
        if region is not None:
            self.pieces.setdefault(orig, []).append((region, tile))

    # --- choosing the cuts --------------------------------------------------------------

    def _choose(self, nid: str, node: Node, ins: Sequence[TensorType], space: Space) -> dict[str, Cuts]:
        axes = {a.name: a for a in space.axes}
        cuts: dict[str, Cuts] = {a.name: (0, a.length) for a in space.axes}
        explicit = self.sizes.explicit.get(nid)
        if explicit is not None:
            for name, v in explicit.items():
                if name not in axes:
                    raise ValueError(f"node {nid!r} ({node.op}) has no split axis {name!r} "
                                     f"(its axes: {sorted(axes) or 'none: it is taken whole'})")
                n = axes[name].length
                cuts[name] = even_cuts(n, v) if isinstance(v, int) else check_cuts((0, *v, n), n)
            return cuts
        if self.cut_enabled:
            for a in space.axes:
                for i, j in a.aligns:
                    src = node.inputs[i] if i < len(node.inputs) else None
                    free = src is None or (self.spaces[src].makes_regions and src not in self.held)
                    grid = None if free else self.grids.get(src) or self.held.get(src)
                    if grid is not None and len(grid.bounds[j]) > 2 and grid.bounds[j][-1] == a.length:
                        cuts[a.name] = grid.bounds[j]
                        break
        ws, _ = self._work(node, ins, space, cuts)
        limit = self.sizes.max_task_bytes
        while ws > limit:
            trial = self._refined(node, ins, space, cuts, ws)
            if trial is None:
                raise LimitError(f"a task of it needs {format_bytes(ws)} (inputs + output) and cannot be "
                                 f"cut further, more than one node's limit of {format_bytes(limit)}",
                                 node=nid, op=node.op)
            cuts, ws = trial
        if not self.cut_enabled:
            return cuts
        work = self._cost(node, ins)
        span = self._span(node, ins, space, cuts, work)
        while _count(cuts) < self.sizes.min_tasks:
            trial = self._refined(node, ins, space, cuts, ws)
            if trial is None:
                break
            _, (in_bytes, out_bytes, fraction) = self._work(node, ins, space, trial[0])
            compute = self._compute_s(work, fraction, sum(in_bytes) + out_bytes)
            if compute < self.sizes.ratio * self.sizes.fixed_s(len(in_bytes)):
                break  # tasks this small are dominated by latency and dispatch
            trial_span = self._span(node, ins, space, trial[0], work)
            if trial_span >= span:
                break
            cuts, ws = trial
            span = trial_span
        return cuts

    def _span(self, node: Node, ins: Sequence[TensorType], space: Space, cuts: dict[str, Cuts],
              work: tuple[float, float]) -> float:
        """Predicted time of the node's tasks on the cluster with these cuts (sizing's
        ``span_s``), with the combine tree of a contraction split: ``parts - 1`` combine
        tasks per output tile, each reading two partials."""
        _, (in_bytes, out_bytes, fraction) = self._work(node, ins, space, cuts)
        s = self.sizes
        task = self._compute_s(work, fraction, sum(in_bytes) + out_bytes) + s.comm_s(in_bytes) + s.fixed_s(0)
        span = s.span_s(_count(cuts), task)
        parts = math.prod(len(cuts[a.name]) - 1 for a in space.axes if a.out_dim is None)
        if parts > 1:
            elements = out_bytes / node.type.dtype.itemsize
            combine = s.compute_s(elements, 3 * out_bytes) + s.comm_s([out_bytes] * 2) + s.fixed_s(0)
            tiles = _count(cuts) // parts
            span += max(combine * math.ceil(math.log2(parts)), s.span_s(tiles * (parts - 1), combine))
        return span

    def _refined(self, node: Node, ins: Sequence[TensorType], space: Space, cuts: dict[str, Cuts],
                 ws: int) -> tuple[dict[str, Cuts], int] | None:
        """The cuts with one axis's intervals halved: the axis that shrinks the largest
        task most (contraction axes count 1.5x, as they add combine tasks); None if none
        shrinks it."""
        best: tuple[float, dict[str, Cuts], int] | None = None
        for a in space.axes:
            c = cuts[a.name]
            if max(hi - lo for lo, hi in itertools.pairwise(c)) <= 1:
                continue
            trial = {**cuts, a.name: refine(c)}
            w, _ = self._work(node, ins, space, trial)
            score = w * (1.5 if a.out_dim is None else 1.0)
            if w < ws and (best is None or score < best[0]):
                best = (score, trial, w)
        return None if best is None else (best[1], best[2])

    def _work(self, node: Node, ins: Sequence[TensorType], space: Space, cuts: dict[str, Cuts]
              ) -> tuple[int, tuple[list[int], int, float]]:
        """Bytes of the largest task (inputs + output; a combine reads two partials), and
        its input bytes, output bytes and fraction of the node's work."""
        ranges = {}
        fraction = 1.0
        for a in space.axes:
            c = cuts[a.name]
            k = max(range(len(c) - 1), key=lambda i: c[i + 1] - c[i])
            ranges[a.name] = (c[k], c[k + 1])
            fraction *= (c[k + 1] - c[k]) / a.length if a.length else 1.0
        partial = any(len(cuts[a.name]) > 2 for a in space.axes if a.out_dim is None)
        task = space.task(ranges, partial)
        in_types = [node.type] if node.op == "input" else list(ins)
        in_bytes = [math.prod(region_shape(r)) * in_types[i].dtype.itemsize for i, r in task.inputs]
        out_bytes = math.prod(region_shape(space.out_region(ranges, node.shape))) * node.type.dtype.itemsize
        ws = sum(in_bytes) + out_bytes
        if partial:
            ws = max(ws, 3 * out_bytes)
        return ws, (in_bytes, out_bytes, fraction)

    def _cost(self, node: Node, ins: Sequence[TensorType]) -> tuple[float, float]:
        """The op table's (flops, bytes) of the whole node, times the cost model's
        calibration of its op (random numbers cost far more than their bytes)."""
        try:
            c = optable.get(node.op).cost(ins, node.type, node.attrs)
        except Exception:  # a user op's cost function may not expect odd shapes
            return float(node.type.size), 0.0
        scale = self.sizes.op_scale.get(node.op, 1.0)
        return float(c.flops) * scale, float(c.bytes) * scale

    def _compute_s(self, work: tuple[float, float], fraction: float, region_bytes: int) -> float:
        """A task's compute time: its share of the node's work, and at least the bytes of
        its regions (a fused program's cost counts its steps' passes, more than those)."""
        return self.sizes.compute_s(work[0] * fraction, max(work[1] * fraction, region_bytes))

    # --- emitting tasks ------------------------------------------------------------------

    def _emit_grid(self, nid: str, node: Node, ins: Sequence[TensorType], space: Space) -> None:
        cuts = self.cuts[nid]
        by_dim = {a.out_dim: a for a in space.axes if a.out_dim is not None}
        contraction = [a for a in space.axes if a.out_dim is None]
        bounds = tuple(cuts[by_dim[d].name] if d in by_dim else (0, n) for d, n in enumerate(node.shape))
        grid = TileGrid(tuple(node.shape), node.dtype, bounds, {})
        partial = any(len(cuts[a.name]) > 2 for a in contraction)
        k_cells = list(itertools.product(*(list(zip(cuts[a.name], cuts[a.name][1:])) for a in contraction)))
        for cell in grid.cells():
            region = grid.region(cell)
            base = f"{nid}[{','.join(map(str, cell))}]"
            ranges = {a.name: region[d] for d, a in by_dim.items()}
            if space.makes_regions:
                tile = self._make_region(nid, region, base)
            elif not partial:
                tile = self._task(nid, node, space.task(ranges, False), base, "tile")
            else:
                parts = []
                for k, kc in enumerate(k_cells):
                    r = {**ranges, **{a.name: iv for a, iv in zip(contraction, kc)}}
                    parts.append(self._task(nid, node, space.task(r, True), f"{base}k{k}", "partial"))
                tile = self._combine(nid, parts, space, base)
            grid.tiles[cell] = tile  # type: ignore[index]
            if not space.makes_regions:  # (_make_region records its own)
                self.pieces.setdefault(nid, []).append((region, tile))
        self.grids[nid] = grid

    def _task(self, nid: str, node: Node, task: Task, name: str, role: str) -> str:
        if node.op == "input":
            in_ids = [nid]
        else:
            in_ids = [self.region_of(node.inputs[i], reg) for i, reg in task.inputs]
        tid = self._fresh(name)
        self.b.add_node(task.op, [self.b.ref(x) for x in in_ids], task.attrs, node_id=tid)
        self._note(tid, nid, role)
        return tid

    def _combine(self, nid: str, parts: list[str], space: Space, base: str) -> str:
        assert space.combine is not None
        n = 0
        while len(parts) > 1:  # a balanced tree: depth log2(parts)
            nxt = []
            for a, c in zip(parts[0::2], parts[1::2]):
                n += 1
                tid = self._fresh(f"{base}+{n}")
                self.b.add_node(space.combine, [self.b.ref(a), self.b.ref(c)], {}, node_id=tid)
                self._note(tid, nid, "combine")
                nxt.append(tid)
            if len(parts) % 2:
                nxt.append(parts[-1])
            parts = nxt
        if space.finish is None:
            return parts[0]
        before = set(self.b.nodes)
        ref = space.finish(self.b, self.b.ref(parts[0]))
        for made in set(self.b.nodes) - before:
            self.taken.add(made)
            self._note(made, nid, "combine")
        final = self._fresh(base)
        self.b.nodes[final] = self.b.nodes.pop(ref.id)  # give the finished tile its grid name
        self.taken.discard(ref.id)
        self.origin.pop(ref.id, None)
        self.roles.pop(ref.id, None)
        self._note(final, nid, "combine")
        return final

    def _make_region(self, nid: str, region: Region, name: str) -> str:
        node = self.g.nodes[nid]
        if node.op == "input" and region == full_region(node.shape):
            return nid
        space = self.spaces[nid]
        ranges = {a.name: region[a.out_dim] for a in space.axes if a.out_dim is not None}
        tid = self._task(nid, node, space.task(ranges, False), name, "source")
        self.pieces.setdefault(nid, []).append((region, tid))
        return tid

    # --- regions of tensors (regroups) ----------------------------------------------------

    def region_of(self, nid: str, region: Region) -> str:
        """A tile-graph node holding exactly ``region`` of original tensor ``nid``."""
        key = (nid, region)
        if key in self.memo:
            return self.memo[key]
        grid = self.grids.get(nid)
        if nid in self.held:  # read from the tiles it is held in
            tid = self._assemble(nid, self.held[nid], region)
        elif self.spaces[nid].makes_regions:
            exact = _exact_cell(grid, region) if grid is not None else None
            tid = grid.tiles[exact] if exact is not None and grid is not None else \
                self._make_region(nid, region, f"{nid}@{_text(region)}")
        else:
            assert grid is not None, f"{nid} has no grid"
            tid = self._assemble(nid, grid, region)
        self.memo[key] = tid
        return tid

    def _assemble(self, nid: str, grid: TileGrid, region: Region) -> str:
        per_dim = grid.overlap(region)
        multi = sorted((d for d in range(len(per_dim)) if len(per_dim[d]) > 1), key=lambda d: len(per_dim[d]))
        # Concats nest outermost-first along the dims with the fewest pieces: joining a
        # c0 x c1 block costs 1 + c_outer concats, so the smaller count goes outside.

        def build(fixed: dict[int, int], level: int) -> str:
            if level == len(multi):
                cell = tuple(per_dim[d][fixed.get(d, 0)][0] for d in range(len(per_dim)))
                sub = tuple(per_dim[d][fixed.get(d, 0)][1:] for d in range(len(per_dim)))
                return self._piece(nid, grid, cell, sub)
            d = multi[level]
            parts = [build({**fixed, d: k}, level + 1) for k in range(len(per_dim[d]))]
            sub = tuple(
                (per_dim[e][0][1], per_dim[e][-1][2]) if e == d or e in multi[level + 1:]
                else per_dim[e][fixed.get(e, 0)][1:] for e in range(len(per_dim)))
            key = (nid, sub)
            if key in self.memo:
                return self.memo[key]
            tid = self._fresh(f"{nid}@{_text(sub)}")
            self.b.add_node("concat", [self.b.ref(p) for p in parts], {"axis": d}, node_id=tid)
            self._note(tid, nid, "regroup", sub)
            self.memo[key] = tid
            return tid

        return build({}, 0)

    def _piece(self, nid: str, grid: TileGrid, cell: tuple[int, ...], sub: Region) -> str:
        cell_reg = grid.region(cell)
        if cell not in grid.tiles:  # a held input's tile, made when first read
            grid.tiles[cell] = self._make_region(nid, cell_reg, f"{nid}[{','.join(map(str, cell))}]")  # type: ignore[index]
        tile = grid.tiles[cell]
        if sub == cell_reg:
            return tile
        key = (nid, sub)
        if key in self.memo:
            return self.memo[key]
        rel = tuple((lo - c0, hi - c0) for (lo, hi), (c0, _) in zip(sub, cell_reg))
        tid = self._fresh(f"{nid}@{_text(sub)}")
        self.b.add_node("slice", [self.b.ref(tile)], {"starts": tuple(lo for lo, _ in rel),
                                                      "stops": tuple(hi for _, hi in rel),
                                                      "steps": (1,) * len(rel)}, node_id=tid)
        self._note(tid, nid, "regroup", sub)
        self.memo[key] = tid
        return tid


def _count(cuts: Mapping[str, Cuts]) -> int:
    return math.prod(len(c) - 1 for c in cuts.values())


def _exact_cell(grid: TileGrid, region: Region) -> tuple[int, ...] | None:
    per_dim = grid.overlap(region)
    if any(len(p) != 1 for p in per_dim):
        return None
    cell = tuple(p[0][0] for p in per_dim)
    return cell if grid.region(cell) == region else None


def _text(region: Region) -> str:
    return ",".join(f"{lo}:{hi}" for lo, hi in region)

