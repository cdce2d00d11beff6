"""``triplane explain TARGET``: compile, place and explain a graph without running it.

TARGET is either

* a graph document: ``.json`` (canonical or not) or ``.yaml`` / ``.yml``, in the IR's
  format (``Graph.from_json`` / ``Graph.from_yaml``); or
* a Python script (``.py``) that builds tensors with ``import triplane as tp``. It runs
  (``runpy``, as ``__name__ == "__triplane_explain__"``) without computing anything,
  unless it asks for values itself. What it explains: the module-level name ``explain`` —
  a tensor, a list/tuple of tensors or a dict name -> tensor; without it, every
  module-level tensor that no other module-level tensor reads (the script's results).

The cluster is ``--nodes`` identical nodes described by the options (memory, GFLOP/s,
GB/s, network bandwidth and latency), or, with ``--registry URL``, the nodes that a live
registry holds now. Prints tables, or with ``--json`` the dict that
``GET /v1/jobs/{id}/plan`` serves.

``triplane/cli.py`` mounts :func:`explain_command` on the ``triplane`` typer app. This
module sits at the top of the package (docs/layout.md): it runs SDK scripts and reads a
live registry, neither of which the compiler may import.
"""

from __future__ import annotations

import asyncio
import json
import runpy
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.costmodel import (
    CostModel,
    NodeFigures,
    parse_bytes,
    parse_rate,
)
from triplane.scheduler.compiler.explain import InputRegion, explain, input_regions, made_regions, render_text
from triplane.scheduler.compiler.pipeline import compile_graph
from triplane.scheduler.compiler.placement import PlacementError, place

__all__ = ["cluster_figures", "explain_command", "explain_target", "load_target"]

SCRIPT_RUN_NAME = "__triplane_explain__"


def load_target(target: Path) -> tuple[Graph, dict[str, str]]:
    """The graph ``target`` describes, and labels (graph node id -> a name a person knows:
    the script's variable names). Raises ``GraphError`` for a bad document or script
    result, ``FileNotFoundError`` for a missing file."""
    suffix = target.suffix.lower()
    if suffix == ".json":
        return Graph.from_json(target.read_bytes()), {}
    if suffix in (".yaml", ".yml"):
        return Graph.from_yaml(target.read_text(encoding="utf-8")), {}
    if suffix == ".py":
        return _graph_of_script(target)
    raise GraphError(f"cannot explain {target.name!r}: expected a graph document (.json, .yaml) "
                     "or a Python script (.py)")


def _graph_of_script(path: Path) -> tuple[Graph, dict[str, str]]:
    from triplane.sdk.tensor import Tensor, build_graph

    if not path.is_file():
        raise FileNotFoundError(f"no such script: {path}")
    try:
        namespace = runpy.run_path(str(path), run_name=SCRIPT_RUN_NAME)
    except Exception as e:  # the user's script: report where it failed, not our traceback
        raise GraphError(f"script {path.name} failed{_script_line(e, path)}: "
                         f"{type(e).__name__}: {e}") from None
    named = {k: v for k, v in namespace.items() if isinstance(v, Tensor) and not k.startswith("_")}
    chosen = namespace.get("explain")
    if chosen is None:
        if not named:
            raise GraphError(f"script {path.name} made no module-level tensor to explain "
                             "(assign `explain = [tensor, ...]`)")
        graph, _, _ = build_graph(list(named.values()))
        read = {i for n in graph.nodes.values() for i in n.inputs}
        outputs = [t for t in named.values() if t._id not in read]
    elif isinstance(chosen, Tensor):
        outputs = [chosen]
    elif isinstance(chosen, Mapping) and all(isinstance(t, Tensor) for t in chosen.values()):
        outputs = list(chosen.values())
        named = {**named, **{str(k): t for k, t in chosen.items()}}
    elif isinstance(chosen, (list, tuple)) and chosen and all(isinstance(t, Tensor) for t in chosen):
        outputs = list(chosen)
    else:
        raise GraphError(f"script {path.name}: `explain` must be a tensor, a list of tensors or a "
                         f"dict of tensors, got {type(chosen).__name__}")
    outputs = list({id(t): t for t in outputs}.values())
    graph, _, _ = build_graph(outputs)
    labels: dict[str, str] = {}
    for name, t in named.items():
        labels.setdefault(t._id, name)
    return graph, labels


def _script_line(e: BaseException, path: Path) -> str:
    """`` at line N`` of the innermost frame of ``e``'s traceback that is in ``path``."""
    line = None
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        if Path(frame.f_code.co_filename).resolve() == path.resolve():
            line = lineno
    return f" at line {line}" if line is not None else ""


def cluster_figures(*, nodes: int, memory: str, gflops: float, gbps: float, bandwidth: str,
                    latency_us: float, registry: str | None = None) -> list[NodeFigures]:
    """The cluster to place on: ``nodes`` identical nodes ``n0, n1, ...``, or what the
    registry at ``registry`` holds (``ValueError`` if it holds no node)."""
    if registry:
        figs = asyncio.run(_read_registry(registry))
        if not figs:
            raise ValueError(f"the registry at {registry} holds no node with an op engine")
        return figs
    if nodes < 1:
        raise ValueError(f"--nodes must be at least 1, got {nodes}")
    mem = parse_bytes(memory)
    bw = parse_rate(bandwidth)
    return [NodeFigures(f"n{i}", gflops=gflops, gbps=gbps, memory_capacity=mem,
                        bandwidth_gbps=bw, latency_us=latency_us) for i in range(nodes)]


async def _read_registry(url: str) -> list[NodeFigures]:
    from triplane.registry.connect import connect_registry
    from triplane.scheduler.cluster import figures_from_registry

    backend = connect_registry(url)
    try:
        return await figures_from_registry(backend)
    finally:
        await backend.close()


def explain_target(target: Path, figures: list[NodeFigures], *,
                   model: CostModel | None = None) -> dict[str, Any]:
    """Load, compile (canonical ids ``n0, n1, ...``, as the runtime names tasks), tile and
    place ``target`` on ``figures`` as the scheduler would (``scheduler.compiler.layout.lay_out``:
    tiny graphs whole, larger ones cut into tiles ``t0, t1, ...``); the explain dict.
    Raises ``GraphError`` (including :class:`PlacementError` and the tiler's
    ``LimitError``) when the graph is bad, too large or cannot be placed."""
    from triplane.scheduler.compiler.layout import lay_out

    graph, labels = load_target(target)
    cgraph, rename, _ = graph.canonical()
    plan = compile_graph(cgraph)
    names: dict[str, str] = {new: labels.get(old, new) for old, new in rename.items()}
    grids: Mapping[str, Any] = {}
    origin_of: Mapping[str, str] = {}
    regions: dict[str, InputRegion] = {}
    if model is not None:  # a calibrated model: place the untiled plan with it
        lay_graph, placement = plan.graph, place(plan.graph, figures, model=model)
    else:
        lay = lay_out(plan.graph, figures).placed()
        assert lay.placement is not None
        lay_graph, placement, grids, origin_of = lay.graph, lay.placement, lay.grids, lay.origin

    def label(t: str) -> str:
        o = origin_of.get(t, t)
        return names.get(o, o)

    if model is None:
        regions = {**input_regions(lay.regions, lay.sources, label), **made_regions(lay.made, label)}
    # every node labelled, inputs too: a task's reads name the tensor each belongs to
    origin = {t: label(t) for t in lay_graph.nodes}
    tiles = {names.get(n, n): g for n, g in grids.items()} if grids else None
    doc = explain(lay_graph, placement, nodes=figures, origin=origin, tiles=tiles, regions=regions)
    doc["tiled"] = bool(grids)
    doc["target"] = str(target)
    doc["cluster"] = [{"node": f.name, "gflops": f.gflops, "gbps": f.gbps,
                       "memory_free_bytes": f.free, "bandwidth_gbps": f.bandwidth_gbps,
                       "latency_us": f.latency_us} for f in figures]
    return doc


def explain_command(
    target: Annotated[Path, typer.Argument(help="a graph document (.json, .yaml) or a Python script (.py)")],
    nodes: Annotated[int, typer.Option(help="number of identical nodes to place on")] = 3,
    memory: Annotated[str, typer.Option(help="free memory per node, e.g. 768MiB, 8GiB")] = "768MiB",
    gflops: Annotated[float, typer.Option(help="matmul GFLOP/s per node")] = 50.0,
    gbps: Annotated[float, typer.Option(help="elementwise memory GB/s per node")] = 10.0,
    bandwidth: Annotated[str, typer.Option(help="network bandwidth per node: 1GB/s, 10Gbit/s")] = "1GB/s",
    latency_us: Annotated[float, typer.Option("--latency-us", help="network latency, µs")] = 100.0,
    registry: Annotated[str | None, typer.Option(help="read the nodes from this registry")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    width: Annotated[int, typer.Option(help="table width in columns")] = 120,
) -> None:
    """Compile and place a graph or script on a cluster and print the plan: each task's
    node, predicted compute and communication time, peak memory per node, makespan."""
    try:
        figures = cluster_figures(nodes=nodes, memory=memory, gflops=gflops, gbps=gbps,
                                  bandwidth=bandwidth, latency_us=latency_us, registry=registry)
        doc = explain_target(target, figures)
    except PlacementError as e:
        _fail(f"{target}: {e} [{e.status.code.value}]")
    except (GraphError, ValueError, OSError) as e:
        _fail(f"cannot explain {target}: {e}")
    if as_json:
        sys.stdout.write(json.dumps(doc, sort_keys=True, allow_nan=False) + "\n")
    else:
        sys.stdout.write(render_text(doc, width=width))


def _fail(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    raise typer.Exit(code=1) from None
