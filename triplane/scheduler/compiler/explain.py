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
                  "pulls": [{"tensor", "from", "bytes", "seconds"}],
                  "actual": {"start_s", "finish_s", "duration_s"} | null,
                  "ratio": float | null}],
     "tensors": [{"tensor", "type", "grid", "tiles": [{"index", "tile", "node", "type"}]}]}

Times are seconds from the job's start. *Actual* timings are what the runtime recorded
per task as ``(start, end)`` on any clock (unix time, say): they are shifted so the
earliest actual start is 0. A task's ratio is its actual duration over its predicted
pull + compute time; the makespan's is actual over predicted. Above 1: slower than
predicted.

Tiles: without a tiler every task's output is one whole tensor (grid ``[1, ...]``).
Given ``tiles`` (original tensor -> its tile grid, as the tiling pass records it), each
tensor lists its tiles with the node that makes each; ``origin`` (tile node -> original
node) labels tasks with the node of the user's graph they came from.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import (
    SCHEDULER,
    NodeFigures,
    format_bytes,
    format_seconds,
    type_text,
)
from triplane.scheduler.compiler.placement import Placement

__all__ = ["EXPLAIN_VERSION", "explain", "grid_tiles", "render_text"]

EXPLAIN_VERSION = 1


def explain(graph: Graph, placement: Placement, *, nodes: Sequence[NodeFigures] = (),
            tiles: Mapping[str, Any] | None = None, origin: Mapping[str, str] | None = None,
            actual: Mapping[str, tuple[float, float]] | None = None,
            locations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The plan of ``graph`` placed as ``placement``, as a JSON-able dict (see the module
    doc). ``nodes`` adds each node's free memory; ``actual`` maps task -> (start, end) as
    recorded by the runtime (tasks missing from it show no actual time); ``locations``
    says where ``input`` tensors are held (default the scheduler)."""
    actual = dict(actual or {})
    t0 = min((s for s, _ in actual.values()), default=0.0)
    tasks = []
    for tp in sorted(placement.tasks.values(), key=lambda tp: (tp.start, tp.node, tp.task)):
        node = graph.nodes[tp.task]
        entry: dict[str, Any] = {
            "task": tp.task, "op": tp.op, "type": type_text(node.type),
            "origin": (origin or {}).get(tp.task, tp.task), "node": tp.node,
            "predicted": {"start_s": tp.start, "finish_s": tp.finish,
                          "compute_s": tp.compute_s, "comm_s": tp.comm_s},
            "pulls": [{"tensor": p.tensor, "from": p.source, "bytes": p.bytes, "seconds": p.seconds}
                      for p in tp.pulls],
            "actual": None, "ratio": None,
        }
        if tp.task in actual:
            s, e = actual[tp.task]
            entry["actual"] = {"start_s": s - t0, "finish_s": e - t0, "duration_s": e - s}
            entry["ratio"] = _ratio(e - s, tp.compute_s + tp.comm_s)
        tasks.append(entry)
    actual_makespan = (max(e for _, e in actual.values()) - t0) if actual else None
    figs = {n.name: n for n in nodes}
    node_rows = []
    for name, placed in placement.by_node().items():
        fig = figs.get(name)
        node_rows.append({"node": name, "tasks": len(placed),
                          "busy_s": sum(tp.compute_s for tp in placed),
                          "peak_memory_bytes": int(placement.peak_memory.get(name, 0)),
                          "memory_free_bytes": fig.free if fig is not None else None})
    return {
        "version": EXPLAIN_VERSION,
        "makespan": {"predicted_s": placement.makespan, "actual_s": actual_makespan,
                     "ratio": _ratio(actual_makespan, placement.makespan)},
        "nodes": node_rows,
        "tasks": tasks,
        "tensors": _tensors(graph, placement, tiles, locations or {}),
    }


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
                                   "node": _where(graph, placement, nid, locations), "type": t}]})
        return out
    for name, grid in tiles.items():
        shape, cells = grid_tiles(grid)
        ttype = type_text(graph.nodes[name].type) if name in graph.nodes else _grid_type(grid)
        entries = []
        for index, tile in cells:
            tnode = graph.nodes.get(tile)
            entries.append({"index": list(index), "tile": tile,
                            "node": _where(graph, placement, tile, locations),
                            "type": type_text(tnode.type) if tnode is not None else "?"})
        out.append({"tensor": name, "type": ttype, "grid": list(shape), "tiles": entries})
    return out


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
    for col in cols:
        tasks.add_column(col, justify="left" if col in ("task", "op", "type", "node") else "right")
    for t in doc["tasks"][:max_tasks]:
        p = t["predicted"]
        label = t["task"] if t["origin"] == t["task"] else f"{t['task']} ({t['origin']})"
        row = [label, t["op"], t["type"], t["node"], _t(p["start_s"]), _t(p["finish_s"]),
               _t(p["compute_s"]), _t(p["comm_s"])]
        if has_actual:
            a = t["actual"] or {}
            row += [_t(a.get("start_s")), _t(a.get("finish_s")), _t(a.get("duration_s")), _r(t["ratio"])]
        tasks.add_row(*row)
    console.print(tasks)
    if len(doc["tasks"]) > max_tasks:
        console.print(f"... and {len(doc['tasks']) - max_tasks} more tasks (--json lists every one)")

    tensors = Table(title="tensors", title_justify="left")
    for col in ("tensor", "type", "grid", "tiles", "made on"):
        tensors.add_column(col)
    for t in doc["tensors"]:
        count: dict[str, int] = {}
        for tile in t["tiles"]:
            count[tile["node"]] = count.get(tile["node"], 0) + 1
        where = ", ".join(f"{n}: {k}" if len(t["tiles"]) > 1 else n for n, k in sorted(count.items()))
        tensors.add_row(t["tensor"], t["type"], "x".join(map(str, t["grid"])) or "1",
                        str(len(t["tiles"])), where)
    console.print(tensors)
    return buf.getvalue()
