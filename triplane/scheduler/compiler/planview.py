"""The body of ``GET /v1/jobs/{id}/plan``: explain's JSON for a job, actuals beside predictions.

Pure: takes a job's :class:`~triplane.scheduler.compiler.layout.Layout`, the submitted names of its
plan nodes and the executors' recorded kernel times, and returns
``triplane.scheduler.compiler.explain.explain``'s dict (schema in its module doc) plus:

* ``"job"``: the job id; ``"tiled"``: whether the plan was cut into tiles;
* tasks labelled (``origin``) with the *submitted* node they came from, tensors keyed by
  the submitted names; each task's ``reads`` name the submitted tensor they are part of
  (``of``), and uploads read in regions are listed with their tiles (their regions);
* per task, ``actual`` from the executor replies' timings (kernel ``start``/``end``, unix
  seconds on the executors' clocks, shifted so that the first start is 0) once it ran;
  and the makespan's ``actual_s`` and ``ratio`` (actual / predicted) once every task ran.

A tiny job (not tiled at submit) is placed on demand here, predictively (the dispatcher
chose its nodes itself; ``"followed": false`` says so). ValueError when a job has too many
tasks to place on demand; PlacementError cannot happen for a job that was accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triplane.scheduler.compiler.explain import explain, input_regions, made_regions
from triplane.scheduler.compiler.layout import Layout

__all__ = ["plan_document"]


def plan_document(job: str, layout: Layout, back: Mapping[str, str],
                  actual: Mapping[str, tuple[float, float]], *, complete: bool) -> dict[str, Any]:
    """See the module doc. ``complete``: every task has run (the makespan's actual is only
    meaningful then; before, tasks show their actuals and the makespan none)."""
    followed = layout.placement is not None
    lay = layout.placed()
    assert lay.placement is not None

    def label(t: str) -> str:  # every node, inputs too: a task's reads name what they are part of
        o = lay.origin.get(t, t)
        return back.get(o, o)

    labels = {t: label(t) for t in lay.graph.nodes}
    tiles = {back.get(nid, nid): grid for nid, grid in lay.grids.items()} if lay.tiled else None
    known = {t: se for t, se in actual.items() if t in lay.placement.tasks}
    doc = explain(lay.graph, lay.placement, nodes=lay.figures, tiles=tiles, origin=labels, actual=known,
                  regions={**input_regions(lay.regions, lay.sources, label), **made_regions(lay.made, label)},
                  cached=lay.cached, complete=complete)
    doc["job"] = job
    doc["tiled"] = lay.tiled
    doc["followed"] = followed
    doc["tasks_run"] = len(known)
    return doc
