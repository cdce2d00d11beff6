"""Memory planning: when each buffer can be freed, and the peak that results.

Steps run in the graph's (topological) order; a value is freed right after its last
reader runs, unless it is an output. ``peak_bytes`` is the largest sum of live buffers
at any step (counting a step's output while its inputs are still live);
``no_reuse_bytes`` is what keeping every buffer to the end would need.
"""

from __future__ import annotations

from dataclasses import dataclass

from triplane.proto.ir import Graph


@dataclass(frozen=True)
class Step:
    node: str
    free: tuple[str, ...]  # values dead once this step has run


@dataclass(frozen=True)
class MemoryPlan:
    steps: tuple[Step, ...]
    peak_bytes: int
    no_reuse_bytes: int


def plan_memory(graph: Graph) -> MemoryPlan:
    order = graph.topo_order()
    position = {nid: i for i, nid in enumerate(order)}
    last_use: dict[str, int] = {nid: position[nid] for nid in order}
    for nid in order:
        for i in graph.nodes[nid].inputs:
            last_use[i] = max(last_use[i], position[nid])
    outputs = set(graph.outputs)
    frees: dict[int, list[str]] = {}
    for nid, pos in last_use.items():
        if nid not in outputs:
            frees.setdefault(pos, []).append(nid)
    live = peak = total = 0
    steps = []
    for pos, nid in enumerate(order):
        nbytes = graph.nodes[nid].type.nbytes
        live += nbytes
        total += nbytes
        peak = max(peak, live)
        dead = tuple(sorted(frees.get(pos, ())))
        live -= sum(graph.nodes[d].type.nbytes for d in dead)
        steps.append(Step(nid, dead))
    return MemoryPlan(tuple(steps), peak, total)
