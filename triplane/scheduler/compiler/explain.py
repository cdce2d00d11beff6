"""The execution plan as a person reads it: tiles, nodes, predicted and actual times.

:func:`explain` condenses a placed task graph into one JSON-able dict (the scheduler
serves it at ``GET /v1/jobs/{id}/plan``); :func:`render_text` draws that dict as tables
for a terminal. Both read the same dict, so they never disagree.

The dict (``version`` 1)::

    {"version": 1,
     "makespan": {"predicted_s": float, "actual_s": float | null, "ratio": float | null},
     "nodes":   [{"node", "tasks", "busy_s", "peak_memory_bytes", "memory_free_bytes"}],
     "tasks":   [{"task", "op", "type", "origin", "node",
                  "predicted": {"start_s", "finish_s", "compute_s", "comm_s"},
                  "reads": [{"tensor", "of", "type", "region", "node"}],
                  "pulls": [{"tensor", "from", "bytes", "seconds"}],
                  "actual": {"start_s", "finish_s", "duration_s"} | null,
                  "ratio": float | null}],
     "tensors": [{"tensor", "type", "grid": [int] | null,
                  "tiles": [{"index": [int] | null, "tile", "node", "type", "region"}]}]}

Times are seconds from the job's start. *Actual* timings are what the runtime recorded
per task as ``(start, end)`` on any clock (unix time, say): they are shifted so the
earliest actual start is 0. A task's ratio is its actual duration over its predicted
pull + compute time; the makespan's is actual over predicted. Above 1: slower than
predicted.

Tiles: without a tiler every task's output is one whole tensor (grid ``[1, ...]``).
Given ``tiles`` (original tensor -> its tile grid, as the tiling pass records it), each
tensor lists its tiles with the node that makes each; ``origin`` (tile node -> original
node) labels tasks with the node of the user's graph they came from. A tile's
``region`` is its box of the tensor (``[[lo, hi], ...]``; null for a grid that does not
say its bounds).

Reads: each task lists what it reads, in argument order. ``tensor`` is the graph node
read (a tile id when tiled); ``node`` where it lives: the task that makes it, or for an
``input`` its holder (``locations``, default the scheduler's data server) -- the task's
own node when that node keeps the tile in its cache (``cached``). Untiled, ``of`` and
``region`` are null (every read is a whole tensor, listed under its own id). Tiled, ``of``
is the original tensor the read belongs to (the upload a region is cut from, the tensor
whose grid cell it is, else the read's ``origin``) and ``region`` its box of ``of``: an
upload region, a grid cell's bounds, the whole box for an input read whole; null when
the read is no box of ``of`` (a partial result, e.g. one strip's partial sum of a split
reduction). ``pulls`` says which of the reads cross the network, from where.

Tensors held in regions (tiled only): given ``regions`` (tile-graph node -> the
:class:`InputRegion` of a whole tensor it stands for: an ``input`` node for a region of
an upload, :func:`input_regions`; a task making one piece of a tensor the tiler makes
region by region, such as a random source cut as its readers need, :func:`made_regions`),
each such tensor is listed in ``tensors`` (before the gridded ones) with one tile per
distinct region. When those regions partition the input into a grid
the entry has that ``grid`` and each tile its ``index``; when they overlap, leave parts
unread or do not line up into a grid, ``grid`` and every ``index`` are null and the
tiles are listed by region. An input read only whole is listed in ``tensors`` only
untiled (a tiled plan would flood the list with unsplit tensors); its reads still name
it.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from triplane.proto.ir import Graph, Node, TensorType
from triplane.scheduler.compiler.costmodel import (
    SCHEDULER,
    NodeFigures,
    format_bytes,
    format_seconds,
    type_text,
)
from triplane.scheduler.compiler.placement import Placement
from triplane.scheduler.compiler.tiling.grid import Region, full_region

__all__ = ["EXPLAIN_VERSION", "InputRegion", "explain", "grid_tiles", "input_regions", "made_regions",
           "render_text", "with_actual"]

EXPLAIN_VERSION = 1


class InputRegion(NamedTuple):
    """A tile-graph node that stands for a box of a whole tensor -- an ``input`` node for a
    region of an upload, or a task making one piece of a tensor the tiler makes region by
    region: ``tensor`` is the whole tensor's name as the document gives it, ``type`` its
    type."""

    tensor: str
    type: TensorType
    region: Region


def input_regions(regions: Mapping[str, tuple[str, Region]], sources: Mapping[str, Node],
                  name: Callable[[str], str]) -> dict[str, InputRegion]:
    """A layout's ``regions`` (node -> (whole input id, region)) and ``sources`` (whole
    input id -> its node) as :func:`explain`'s ``regions``; ``name`` maps a whole input's
    id to its name in the document (the same name ``origin`` gives its other tiles)."""
    return {nid: InputRegion(name(whole), sources[whole].type, tuple((int(a), int(b)) for a, b in reg))
            for nid, (whole, reg) in regions.items() if whole in sources}


def made_regions(made: Mapping[str, tuple[TensorType, Sequence[tuple[Region, str]]]],
                 name: Callable[[str], str]) -> dict[str, InputRegion]:
    """A layout's ``made`` (tensor -> (type, ((region, task), ...))) as :func:`explain`'s
    ``regions``: each piece's task stands for its box of the tensor named ``name(tensor)``."""
    return {task: InputRegion(name(nid), ttype, tuple((int(a), int(b)) for a, b in reg))
            for nid, (ttype, pieces) in made.items() for reg, task in pieces}


def explain(graph: Graph, placement: Placement, *, nodes: Sequence[NodeFigures] = (),
            tiles: Mapping[str, Any] | None = None, origin: Mapping[str, str] | None = None,
            actual: Mapping[str, tuple[float, float]] | None = None,
            locations: Mapping[str, str] | None = None, regions: Mapping[str, InputRegion] | None = None,
            cached: Mapping[str, Sequence[str]] | None = None,
            complete: bool | None = None) -> dict[str, Any]:
    """The plan of ``graph`` placed as ``placement``, as a JSON-able dict (see the module
    doc). ``nodes`` adds each node's free memory; ``actual`` maps task -> (start, end) as
    recorded by the runtime (tasks missing from it show no actual time); ``locations``
    says where ``input`` tensors are held (default the scheduler); ``regions`` which
    ``input`` nodes are regions of a whole input; ``cached`` which executors keep which
    ``input`` tiles in their cache; ``complete`` whether the makespan's actual is set
    (:func:`with_actual`)."""
    reads = _Reads(graph, placement, tiles, origin or {}, regions or {}, locations or {}, cached or {})
    tasks = []
    for tp in sorted(placement.tasks.values(), key=lambda tp: (tp.start, tp.node, tp.task)):
        node = graph.nodes[tp.task]
        entry: dict[str, Any] = {
            "task": tp.task, "op": tp.op, "type": type_text(node.type),
            "origin": (origin or {}).get(tp.task, tp.task), "node": tp.node,
            "predicted": {"start_s": tp.start, "finish_s": tp.finish,
                          "compute_s": tp.compute_s, "comm_s": tp.comm_s},
            "reads": [reads.of(i, tp.node) for i in node.inputs],
            "pulls": [{"tensor": p.tensor, "from": p.source, "bytes": p.bytes, "seconds": p.seconds}
                      for p in tp.pulls],
            "actual": None, "ratio": None,
        }
        tasks.append(entry)
    figs = {n.name: n for n in nodes}
    node_rows = []
    for name, placed in placement.by_node().items():
        fig = figs.get(name)
        node_rows.append({"node": name, "tasks": len(placed),
                          "busy_s": sum(tp.compute_s for tp in placed),
                          "peak_memory_bytes": int(placement.peak_memory.get(name, 0)),
                          "memory_free_bytes": fig.free if fig is not None else None})
    doc = {
        "version": EXPLAIN_VERSION,
        "makespan": {"predicted_s": placement.makespan, "actual_s": None, "ratio": None},
        "nodes": node_rows,
        "tasks": tasks,
        "tensors": (_input_tensors(graph, placement, regions or {}, origin or {}, locations or {}, tiles)
                    if tiles is not None else []) + _tensors(graph, placement, tiles, locations or {}),
    }
    return with_actual(doc, actual or {}, complete=complete)


def with_actual(doc: Mapping[str, Any], actual: Mapping[str, tuple[float, float]], *,
                complete: bool | None = None) -> dict[str, Any]:
    """Explain's JSON ``doc`` with actual times from ``actual`` (task -> (start, end) on any
    clock): per task ``actual`` {start_s, finish_s, duration_s}, shifted so that the first
    start is 0, and ``ratio`` (duration over predicted compute + comm); tasks missing from
    ``actual`` keep theirs. The makespan's ``actual_s`` and ``ratio`` are set when
    ``complete`` (default: every task has a time), else null. Also serves a document
    stored earlier (a restarted scheduler's recorded plan)."""
    tasks = doc.get("tasks") or []
    known = {t["task"]: actual[t["task"]] for t in tasks if t.get("task") in actual}
    makespan = {**(doc.get("makespan") or {}), "actual_s": None, "ratio": None}
    if not known:
        return {**doc, "makespan": makespan}
    t0 = min(start for start, _ in known.values())
    out = []
    for t in tasks:
        se = known.get(t["task"])
        if se is None:
            out.append(t)
            continue
        start, end = se
        p = t.get("predicted") or {}
        out.append({**t, "actual": {"start_s": start - t0, "finish_s": end - t0, "duration_s": end - start},
                    "ratio": _ratio(end - start, p.get("compute_s", 0.0) + p.get("comm_s", 0.0))})
    if len(known) == len(tasks) if complete is None else complete:
        makespan["actual_s"] = max(end for _, end in known.values()) - t0
        makespan["ratio"] = _ratio(makespan["actual_s"], makespan.get("predicted_s", 0.0))
    return {**doc, "tasks": out, "makespan": makespan}


def _ratio(actual: float | None, predicted: float) -> float | None:
    if actual is None or predicted <= 0 or not math.isfinite(actual):
        return None
    return actual / predicted


def _where(graph: Graph, placement: Placement, nid: str, locations: Mapping[str, str]) -> str:
    if nid in placement.tasks:
        return placement.tasks[nid].node
    if nid in graph.nodes and graph.nodes[nid].op == "input":
        return locations.get(nid, SCHEDULER)
    return "?"


def _tensors(graph: Graph, placement: Placement, tiles: Mapping[str, Any] | None,
             locations: Mapping[str, str]) -> list[dict[str, Any]]:
    out = []
    if tiles is None:
        for nid, node in graph.nodes.items():
            t = type_text(node.type)
            out.append({"tensor": nid, "type": t, "grid": [1] * node.type.ndim,
                        "tiles": [{"index": [0] * node.type.ndim, "tile": nid,
                                   "node": _where(graph, placement, nid, locations), "type": t,
                                   "region": _box(full_region(node.shape))}]})
        return out
    for name, grid in tiles.items():
        shape, cells = grid_tiles(grid)
        ttype = type_text(graph.nodes[name].type) if name in graph.nodes else _grid_type(grid)
        entries = []
        for index, tile in cells:
            tnode = graph.nodes.get(tile)
            entries.append({"index": list(index), "tile": tile,
                            "node": _where(graph, placement, tile, locations),
                            "type": type_text(tnode.type) if tnode is not None else "?",
                            "region": _box(_cell_region(grid, index))})
        out.append({"tensor": name, "type": ttype, "grid": list(shape), "tiles": entries})
    return out


def _box(region: Region | None) -> list[list[int]] | None:
    return None if region is None else [[lo, hi] for lo, hi in region]


def _cell_region(grid: Any, index: tuple[int, ...]) -> Region | None:
    """The box of cell ``index`` of a grid that says its bounds (the tiler's TileGrid)."""
    bounds = getattr(grid, "bounds", None)
    if not isinstance(bounds, (list, tuple)) or len(bounds) != len(index):
        return None
    try:
        return tuple((int(bounds[d][k]), int(bounds[d][k + 1])) for d, k in enumerate(index))
    except (IndexError, TypeError, ValueError):
        return None


class _Reads:
    """Builds a task's ``reads`` entries (see the module doc)."""

    def __init__(self, graph: Graph, placement: Placement, tiles: Mapping[str, Any] | None,
                 origin: Mapping[str, str], regions: Mapping[str, InputRegion],
                 locations: Mapping[str, str], cached: Mapping[str, Sequence[str]]) -> None:
        self.graph, self.placement, self.origin = graph, placement, origin
        self.regions, self.locations, self.cached = regions, locations, cached
        self.tiled = tiles is not None
        self.cells: dict[str, tuple[str, Region | None]] = {}  # tile -> (tensor, its box)
        for name, grid in (tiles or {}).items():
            for index, tile in grid_tiles(grid)[1]:
                self.cells.setdefault(tile, (name, _cell_region(grid, index)))

    def of(self, tensor: str, reader: str) -> dict[str, Any]:
        """The entry of ``tensor`` read by a task placed on node ``reader``."""
        node = self.graph.nodes[tensor]
        of: str | None = None
        region: Region | None = None
        if tensor in self.regions:
            of, region = self.regions[tensor].tensor, self.regions[tensor].region
        elif tensor in self.cells:
            of, region = self.cells[tensor]
        elif self.tiled:
            label = self.origin.get(tensor, tensor)
            of = label if label != tensor else None
            if of is not None and node.op == "input":
                region = full_region(node.shape)
        where = reader if reader in self.cached.get(tensor, ()) else \
            _where(self.graph, self.placement, tensor, self.locations)
        return {"tensor": tensor, "of": of, "type": type_text(node.type), "region": _box(region),
                "node": where}


def _input_tensors(graph: Graph, placement: Placement, regions: Mapping[str, InputRegion],
                   origin: Mapping[str, str], locations: Mapping[str, str],
                   tiles: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tensors held in regions -- inputs read in regions, tensors made piece by piece --
    each with one tile per distinct region (module doc)."""
    parts: dict[str, tuple[TensorType, dict[Region, str]]] = {}
    for nid in graph.nodes:
        r = regions.get(nid)
        if r is not None and r.tensor not in tiles:
            parts.setdefault(r.tensor, (r.type, {}))[1].setdefault(r.region, nid)
    for nid, node in graph.nodes.items():  # the same input also read whole, beside its regions
        name = origin.get(nid)
        if node.op == "input" and nid not in regions and name in parts:
            parts[name][1].setdefault(full_region(node.shape), nid)
    out = []
    for name, (ttype, boxes) in parts.items():
        bounds = _region_grid(ttype.shape, boxes)
        entries: list[dict[str, Any]] = []
        for box, tile in sorted(boxes.items()):
            index = None if bounds is None else [b.index(lo) for b, (lo, _) in zip(bounds, box)]
            entries.append({"index": index, "tile": tile,
                            "node": _where(graph, placement, tile, locations),
                            "type": type_text(graph.nodes[tile].type), "region": _box(box)})
        if bounds is not None:
            entries.sort(key=lambda e: e["index"])
        out.append({"tensor": name, "type": type_text(ttype),
                    "grid": None if bounds is None else [len(b) - 1 for b in bounds], "tiles": entries})
    return out


def _region_grid(shape: Sequence[int], boxes: Iterable[Region]) -> list[list[int]] | None:
    """Each dimension's boundaries when ``boxes`` are exactly the cells of a grid over
    ``shape`` (every cell read, none twice, none overlapping), else None."""
    boxes = list(boxes)
    bounds = [sorted({0, int(n)} | {b[d][0] for b in boxes} | {b[d][1] for b in boxes})
              for d, n in enumerate(shape)]
    if any(b[0] != 0 or b[-1] != n for b, n in zip(bounds, shape)):
        return None
    nxt = [dict(itertools.pairwise(b)) for b in bounds]
    if any(nxt[d].get(lo) != hi for box in boxes for d, (lo, hi) in enumerate(box)):
        return None  # a box spanning several cells: regions overlap or differ in cut
    if len(set(boxes)) != math.prod(len(b) - 1 for b in bounds):
        return None  # some cell not read
    return bounds


def _grid_type(grid: Any) -> str:
    shape, dtype = getattr(grid, "shape", None), getattr(grid, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{getattr(dtype, 'name', dtype)}{list(shape)}"
    return "?"


def grid_tiles(grid: Any) -> tuple[tuple[int, ...], list[tuple[tuple[int, ...], str]]]:
    """``(grid shape, [(index, tile node id), ...])`` of one tensor's tile grid.

    Accepts the tiling pass's grid object (tile ids under ``tiles``, ``cells`` or
    ``ids``: a mapping index -> id or a nested list in row-major order; the grid shape
    from ``grid_shape``, ``counts`` or the ids), or plainly a mapping index -> id, a
    (nested) list of ids, or one id (a tensor kept whole)."""
    if isinstance(grid, str):
        return (), [((), grid)]
    ids: Any = grid
    for attr in ("tiles", "cells", "ids"):
        v = getattr(grid, attr, None)
        if v is not None and not callable(v):
            ids = v
            break
        if callable(v):
            try:
                ids = v()
                break
            except TypeError:
                continue
    if isinstance(ids, Mapping):
        cells = sorted((tuple(k) if isinstance(k, Iterable) else (int(k),), str(v)) for k, v in ids.items())
        shape: tuple[int, ...] = tuple(max(ix[d] for ix, _ in cells) + 1 for d in range(len(cells[0][0]))) \
            if cells else ()
    elif isinstance(ids, (list, tuple)):
        cells = []
        shape = _nested_shape(ids)
        _walk(ids, (), cells)
    else:
        raise TypeError(f"cannot read tile ids from {type(grid).__name__}: expected a mapping "
                        "index -> tile id, a nested list of ids, or an object with .tiles")
    for attr in ("grid_shape", "counts"):
        v = getattr(grid, attr, None)
        if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
            shape = tuple(v)
            break
    return shape, cells


def _nested_shape(x: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(x, (list, tuple)):
        shape.append(len(x))
        if not x:
            break
        x = x[0]
    return tuple(shape)


def _walk(x: Any, index: tuple[int, ...], out: list[tuple[tuple[int, ...], str]]) -> None:
    if isinstance(x, (list, tuple)):
        for k, y in enumerate(x):
            _walk(y, (*index, k), out)
    else:
        out.append((index, str(x)))


# --- the terminal rendering -----------------------------------------------------------


def _t(x: float | None) -> str:
    return "—" if x is None else format_seconds(x)


def _r(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def render_text(doc: Mapping[str, Any], *, width: int = 120, max_tasks: int = 200,
                color: bool = False) -> str:
    """``doc`` (from :func:`explain`) as terminal tables. At most ``max_tasks`` task rows
    (the first to start); the rest are counted."""
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None,
                      highlight=False)
    ms = doc["makespan"]
    line = f"[bold]predicted makespan[/bold] {_t(ms['predicted_s'])}"
    if ms["actual_s"] is not None:
        line += f"   [bold]actual[/bold] {_t(ms['actual_s'])}   [bold]ratio[/bold] {_r(ms['ratio'])}"
    console.print(line + f"   ({len(doc['tasks'])} tasks on {len(doc['nodes'])} nodes)")

    nodes = Table(title="nodes", title_justify="left")
    for col in ("node", "tasks", "busy", "peak memory", "free memory"):
        nodes.add_column(col, justify="left" if col == "node" else "right")
    for n in doc["nodes"]:
        free = n["memory_free_bytes"]
        nodes.add_row(n["node"], str(n["tasks"]), _t(n["busy_s"]), format_bytes(n["peak_memory_bytes"]),
                      "—" if free is None else format_bytes(free))
    console.print(nodes)

    has_actual = any(t["actual"] is not None for t in doc["tasks"])
    tasks = Table(title="tasks", title_justify="left")
    cols = ["task", "op", "type", "node", "start", "finish", "compute", "comm"]
    if has_actual:
        cols += ["actual start", "actual finish", "actual", "ratio"]
    cols.append("reads")
    for col in cols:
        tasks.add_column(col, justify="left" if col in ("task", "op", "type", "node", "reads") else "right")
    shapes = {t["tensor"]: _dims(t["type"]) for t in doc["tensors"]}
    for t in doc["tasks"][:max_tasks]:
        p = t["predicted"]
        label = t["task"] if t["origin"] == t["task"] else f"{t['task']} ({t['origin']})"
        row = [label, t["op"], t["type"], t["node"], _t(p["start_s"]), _t(p["finish_s"]),
               _t(p["compute_s"]), _t(p["comm_s"])]
        if has_actual:
            a = t["actual"] or {}
            row += [_t(a.get("start_s")), _t(a.get("finish_s")), _t(a.get("duration_s")), _r(t["ratio"])]
        row.append(_reads_text(t.get("reads") or [], shapes))
        tasks.add_row(*row)
    console.print(tasks)
    if len(doc["tasks"]) > max_tasks:
        console.print(f"... and {len(doc['tasks']) - max_tasks} more tasks (--json lists every one)")

    tensors = Table(title="tensors", title_justify="left")
    for col in ("tensor", "type", "grid", "tiles", "on"):
        tensors.add_column(col)
    for t in doc["tensors"]:
        count: dict[str, int] = {}
        for tile in t["tiles"]:
            count[tile["node"]] = count.get(tile["node"], 0) + 1
        where = ", ".join(f"{n}: {k}" if len(t["tiles"]) > 1 else n for n, k in sorted(count.items()))
        grid = "irregular" if t["grid"] is None else "x".join(map(str, t["grid"])) or "1"
        tensors.add_row(t["tensor"], t["type"], grid, str(len(t["tiles"])), where)
    console.print(tensors)
    return buf.getvalue()


MAX_READS_SHOWN = 3  # per task row; --json lists every one


def _reads_text(reads: Sequence[Mapping[str, Any]], shapes: Mapping[str, list[int] | None]) -> str:
    """A task's reads in a cell: ``x[0:4096, :]`` for a box of ``x`` (``:`` for a whole
    dimension), ``x`` for all of it, the tile id for anything else; the rest counted.
    ``shapes``: the listed tensors' shapes (a tensor not listed is read whole, if at all
    as a box: its shape is the read's)."""
    shown = [_read_text(r, shapes) for r in reads[:MAX_READS_SHOWN]]
    if len(reads) > MAX_READS_SHOWN:
        shown.append(f"+{len(reads) - MAX_READS_SHOWN} more")
    return ", ".join(shown) or "—"


def _read_text(r: Mapping[str, Any], shapes: Mapping[str, list[int] | None]) -> str:
    of, region = r.get("of"), r.get("region")
    if of is None or region is None:
        return str(r["tensor"])
    dims = shapes[of] if of in shapes else _dims(r["type"])
    cuts = [":" if lo == 0 and dims is not None and d < len(dims) and hi == dims[d] else f"{lo}:{hi}"
            for d, (lo, hi) in enumerate(region)]
    return str(of) if all(c == ":" for c in cuts) else f"{of}[{', '.join(cuts)}]"


def _dims(ttype: str) -> list[int] | None:
    """The shape in a type text (``float32[4096, 8192]``), None if it has none."""
    _, _, rest = ttype.partition("[")
    try:
        return [int(x) for x in rest.rstrip("]").split(",") if x.strip()] if rest else None
    except ValueError:
        return None
