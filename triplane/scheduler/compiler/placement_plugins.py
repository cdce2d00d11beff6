"""Placement's extension points and built-in plugins (after the Kubernetes scheduler framework).

:func:`~triplane.scheduler.compiler.placement.place` asks, for each task and node:

* **Filter** ``filter(task, node, estimate, state) -> Status``: may this node run it?
  ``Unschedulable`` means "not here now", ``UnschedulableAndUnresolvable`` "never here";
  ``summarize(task, failed, state)`` says why for the whole cluster when every node is
  filtered out. ``Error`` stops placement at once.
* **Score** ``score(task, node, estimate, state) -> float`` (higher is better), weighted
  and normalised to 0..100 over the nodes whose predicted finish ties with the earliest.
* **Bind** ``bind(task, estimate, state) -> Status``: record the decision; the first
  binder that does not answer ``Skip`` decides.

The plugins read :class:`~triplane.scheduler.compiler.placement.PlacementState` (what is
decided so far) and the task's :class:`~triplane.scheduler.compiler.placement.TaskView`;
they never import the framework, so this module has no cycle with it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from triplane.proto.ir import Node
from triplane.scheduler.compiler.costmodel import NodeFigures, format_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triplane.scheduler.compiler.placement import Estimate, PlacementState, TaskView

__all__ = [
    "SUCCESS", "Binder", "BindPlugin", "Code", "EngineSpeed", "FilterPlugin", "FitsMemory", "Framework",
    "LeastLoaded", "LocalBytes", "ScorePlugin", "Status", "SupportsOp",
]


class Code(enum.Enum):
    """What a plugin's answer means for the framework."""

    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    ERROR = "Error"
    SKIP = "Skip"


@dataclass(frozen=True)
class Status:
    """A plugin's coded answer with a reason a person can act on."""

    code: Code = Code.SUCCESS
    reason: str = ""
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "reason": self.reason, "plugin": self.plugin}


SUCCESS = Status()


# --- plugins ---------------------------------------------------------------------------


class FilterPlugin(Protocol):
    name: str

    def filter(self, task: TaskView, node: NodeFigures, est: Estimate | None,
               state: PlacementState) -> Status: ...

    def summarize(self, task: TaskView, failed: Mapping[str, Status], state: PlacementState) -> str: ...


class ScorePlugin(Protocol):
    name: str

    def score(self, task: TaskView, node: NodeFigures, est: Estimate, state: PlacementState) -> float: ...


class BindPlugin(Protocol):
    name: str

    def bind(self, task: TaskView, est: Estimate, state: PlacementState) -> Status: ...


class SupportsOp:
    """The node has an engine for the op and every dtype the task reads or writes (a
    ``fused`` task also needs every op of its program)."""

    name = "SupportsOp"

    def filter(self, task: TaskView, node: NodeFigures, est: Estimate | None,
               state: PlacementState) -> Status:
        ops = _ops_needed(task.node)
        lacking = [op for op in ops if not node.supports_op(op)]
        if lacking:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                          f"{node.name} has no engine for {', '.join(lacking)}", self.name)
        bad = sorted(d for d in task.dtypes if not node.supports_dtype(d))
        if bad:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                          f"{node.name}'s engines do not take {', '.join(bad)}", self.name)
        return SUCCESS

    def summarize(self, task: TaskView, failed: Mapping[str, Status], state: PlacementState) -> str:
        ops = _ops_needed(task.node)
        figs = state.figures.values()
        missing = [op for op in ops if not any(f.supports_op(op) for f in figs)]
        if missing:
            return f"no engine supports {', '.join(missing)} (nodes: {', '.join(sorted(failed))})"
        with_op = [f for f in figs if all(f.supports_op(op) for op in ops)]
        bad = sorted(d for d in task.dtypes if not any(f.supports_dtype(d) for f in with_op))
        if bad:
            return f"no engine supports {task.op} on {', '.join(bad)}"
        return f"no engine supports {task.op} on {', '.join(sorted(task.dtypes))} together"


def _ops_needed(node: Node) -> list[str]:
    ops = [node.op]
    if node.op == "fused":
        for step in node.attrs.get("program", ()):
            if step[0] not in ops:
                ops.append(step[0])
    return ops


class FitsMemory:
    """The task's inputs and output fit the node's memory, beside what is live there."""

    name = "FitsMemory"

    def filter(self, task: TaskView, node: NodeFigures, est: Estimate | None,
               state: PlacementState) -> Status:
        need = task.working_set
        if need > node.free:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                          f"needs {format_bytes(need)}, {node.name} has {format_bytes(node.free)} free",
                          self.name)
        if est is None:
            live = state.memory[node.name].open_bytes
            return Status(Code.UNSCHEDULABLE,
                          f"needs {format_bytes(need)}, {node.name} holds {format_bytes(live)} of "
                          f"{format_bytes(node.free)} in tensors still to be read", self.name)
        return SUCCESS

    def summarize(self, task: TaskView, failed: Mapping[str, Status], state: PlacementState) -> str:
        need = task.working_set
        largest = max(sorted(state.figures.values(), key=lambda f: f.name), key=lambda f: f.free)
        if need > largest.free:
            return (f"needs {format_bytes(need)} (inputs + output), the largest free memory is "
                    f"{format_bytes(largest.free)} on {largest.name}")
        return "; ".join(s.reason for s in failed.values())


class LocalBytes:
    """Prefer the node already holding most of the task's input bytes."""

    name = "LocalBytes"

    def score(self, task: TaskView, node: NodeFigures, est: Estimate, state: PlacementState) -> float:
        return float(state.local_bytes(task, node.name))


class LeastLoaded:
    """Prefer the node with the least predicted busy time so far."""

    name = "LeastLoaded"

    def score(self, task: TaskView, node: NodeFigures, est: Estimate, state: PlacementState) -> float:
        return -state.busy[node.name]


class EngineSpeed:
    """Prefer the node whose engine runs this task fastest."""

    name = "EngineSpeed"

    def score(self, task: TaskView, node: NodeFigures, est: Estimate, state: PlacementState) -> float:
        return -est.compute_s


class Binder:
    """The default binder: commit the decision to the state."""

    name = "DefaultBinder"

    def bind(self, task: TaskView, est: Estimate, state: PlacementState) -> Status:
        state.commit(task, est)
        return SUCCESS


@dataclass
class Framework:
    """The plugins placement runs. ``tie_s``: finishes within this many seconds of the
    earliest count as tied, and scores decide among them. ``pressure``: once tensors
    still to be read fill this fraction of the cluster's free memory, ready tasks are
    taken by the memory they free first (then by rank), so that a wide graph finishes
    branches before it starts new ones."""

    filters: list[FilterPlugin] = field(default_factory=lambda: [SupportsOp(), FitsMemory()])
    scores: list[tuple[ScorePlugin, float]] = field(
        default_factory=lambda: [(LocalBytes(), 2.0), (LeastLoaded(), 1.0), (EngineSpeed(), 1.0)])
    binders: list[BindPlugin] = field(default_factory=lambda: [Binder()])
    tie_s: float = 1e-9
    pressure: float = 0.5
