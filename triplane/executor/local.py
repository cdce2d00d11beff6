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
    return KernelList(plan, engine).run(bindings, stats)


# Ops whose value is a function of their attributes alone: a replayed kernel list makes
# each such value once (read-only) rather than once per run, when it is small (a large
# one is made per run, so that it is held only while the memory plan says).
_CONSTANT_OPS = frozenset({"full", "constant"})
_CONSTANT_BYTES = 1 << 16


def _once(call: Any) -> Any:
    made: list[np.ndarray] = []

    def value(inputs: list[np.ndarray]) -> np.ndarray:
        if not made:
            v = call(inputs)
            v.flags.writeable = False
            made.append(v)
        return made[0]

    return value


class KernelList:
    """A plan flattened once into the list of kernels it runs, to be replayed with new
    input bindings (the embedded session's compiled steps): per step the op, its input
    slots, attributes and output type, and the values it frees, so a replay reads no
    graph and builds no node or type objects. An engine with ``bind(op, attrs, out,
    in_types)`` (the numpy engine's) prepares each kernel call once here (and a small ``full``
    or ``constant`` node's value: made at the first run, read-only); the list then runs
    them all under one ``np.errstate(all="ignore")``. ``run`` checks each bound
    array's shape and dtype against the graph, as ``run_plan`` always did."""

    def __init__(self, plan: RunnablePlan, engine: Any) -> None:
        graph = plan.graph
        self.engine = engine
        self.outputs = tuple(graph.outputs)
        bind = getattr(engine, "bind", None)
        # Inputs are bound before any kernel runs (the caller holds their arrays anyway);
        # the peak the memory plan's order gives is the same every run: counted here.
        self.inputs: list[tuple[str, str, tuple[int, ...], np.dtype, Any, tuple[str, ...]]] = []
        self.kernels: list[tuple[str, str, tuple[str, ...], Any, Any, Any, tuple[str, ...]]] = []
        live = self.peak_bytes = 0
        bound: set[str] = set()
        for step in plan.memory.steps:
            node = graph.nodes[step.node]
            ty = node.type
            if node.op == "input":
                bound.add(step.node)
                self.inputs.append((step.node, node.attrs["tensor"], ty.shape, ty.dtype.np, ty,
                                    tuple(d for d in step.free if d in bound)))
                later = tuple(d for d in step.free if d not in bound)
                if later:  # kernel values whose last reader ran before: free them after it
                    *head, last = self.kernels[-1]
                    self.kernels[-1] = (*head, last + later)
            else:
                call = None
                if bind is not None:
                    call = bind(node.op, node.attrs, ty, [graph.nodes[i].type for i in node.inputs])
                    if call is not None and node.op in _CONSTANT_OPS and ty.nbytes <= _CONSTANT_BYTES:
                        call = _once(call)
                self.kernels.append((step.node, node.op, tuple(node.inputs), node.attrs, ty, call,
                                     tuple(step.free)))
            live += ty.nbytes
            self.peak_bytes = max(self.peak_bytes, live)
            live -= sum(graph.nodes[d].type.nbytes for d in step.free)

    def run(self, bindings: Mapping[str, np.ndarray],
            stats: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        """Run every kernel; the outputs by node id. Raises KernelError naming the node."""
        run = self.engine.run
        values: dict[str, np.ndarray] = {}
        for nid, key, shape, dtype, ty, free in self.inputs:
            arr = bindings.get(key)
            if arr is None:
                raise KernelError(f"no data bound for input tensor {key!r}", node=nid, op="input",
                                  kind="infra")
            if type(arr) is not np.ndarray:
                arr = np.asarray(arr)
            if arr.shape != shape or arr.dtype != dtype:
                raise KernelError(f"bound data is {arr.dtype}{list(arr.shape)}, the graph declares "
                                  f"{ty.dtype.name}{list(ty.shape)}", node=nid, op="input")
            values[nid] = arr
            for dead in free:
                del values[dead]
        with np.errstate(all="ignore"):
            for nid, op, inputs, attrs, ty, call, free in self.kernels:
                try:
                    if call is None:
                        values[nid] = run(op, [values[i] for i in inputs], attrs, ty)
                    else:
                        values[nid] = call([values[i] for i in inputs])
                except KernelError as e:
                    if e.node is None:
                        raise KernelError(str(e), node=nid, op=op, kind=e.kind) from e
                    raise
                for dead in free:
                    del values[dead]
        if stats is not None:
            stats["peak_bytes"] = self.peak_bytes
        return {o: values[o] for o in self.outputs}
