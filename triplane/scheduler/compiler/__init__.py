"""The graph compiler: pure passes Graph -> Graph, then an execution plan.

Order (docs/concepts.md): validate -> dead-code elimination -> common subexpression
elimination -> constant folding -> elementwise fusion -> memory planning. Autograd
(``triplane.proto.autograd``, shared with the SDK) runs before all of them, when gradients
are asked for. Tiling and placement join for
cluster runs.
"""

from triplane.scheduler.compiler.dce import dce
from triplane.scheduler.compiler.memory import MemoryPlan, Step, plan_memory
from triplane.scheduler.compiler.pipeline import CompileOptions, Plan, PlanCache, compile_graph

__all__ = [
    "CompileOptions", "MemoryPlan", "Plan", "PlanCache", "Step",
    "compile_graph", "dce", "plan_memory",
]
