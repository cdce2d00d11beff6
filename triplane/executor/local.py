"""Running a compiled plan in this process (the embedded mode and the reference path).

The plan is anything shaped like the compiler's ``Plan`` (a graph and a memory plan's
steps): the executor does not import the compiler, which sits beside it. Values live
in a dict for exactly as long as the memory plan says; ``input`` nodes are bound from
host arrays by tensor id. A kernel's error is re-raised as KernelError naming the node it
ran for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from triplane.proto.errors import KernelError
from triplane.proto.ir import Graph


class PlanStep(Protocol):
    node: str  # the node computed by this step
    free: Sequence[str]  # values dead once it has run


class MemorySteps(Protocol):
    steps: Sequence[PlanStep]


class RunnablePlan(Protocol):
    """What ``run_plan`` reads of a compiled plan (``scheduler.compiler.pipeline.Plan``)."""

    graph: Graph
    memory: MemorySteps


def run_plan(plan: RunnablePlan, bindings: Mapping[str, np.ndarray], engine: Any,
             stats: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Execute ``plan`` on ``engine``; ``bindings`` maps input tensor ids to arrays.
    Returns the graph's outputs by node id. ``stats`` (if given) receives ``peak_bytes``
    actually held, counted the way the memory plan counts."""
    graph = plan.graph
    values: dict[str, np.ndarray] = {}
    live = peak = 0
    for step in plan.memory.steps:
        node = graph.nodes[step.node]
        if node.op == "input":
            key = node.attrs["tensor"]
            if key not in bindings:
                raise KernelError(f"no data bound for input tensor {key!r}", node=step.node, op="input",
                                  kind="infra")
            arr = np.asarray(bindings[key])
            if arr.shape != tuple(node.shape) or arr.dtype != node.type.dtype.np:
                raise KernelError(f"bound data is {arr.dtype}{list(arr.shape)}, the graph declares "
                                  f"{node.dtype}{list(node.shape)}", node=step.node, op="input")
            values[step.node] = arr
        else:
            try:
                values[step.node] = engine.run(node.op, [values[i] for i in node.inputs],
                                               node.attrs, node.type)
            except KernelError as e:
                if e.node is None:
                    raise KernelError(str(e), node=step.node, op=node.op, kind=e.kind) from e
                raise
        live += node.type.nbytes
        peak = max(peak, live)
        for dead in step.free:
            live -= graph.nodes[dead].type.nbytes
            del values[dead]
    if stats is not None:
        stats["peak_bytes"] = peak
    return {o: values[o] for o in graph.outputs}
