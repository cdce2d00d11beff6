"""The graph compiler: pure passes Graph -> Graph, then an execution plan.

Order (docs/concepts.md): validate -> dead-code elimination -> common subexpression
elimination -> constant folding -> elementwise fusion -> memory planning. Autograd runs
before all of them, when the SDK asks for gradients. Tiling and placement join for
cluster runs.
"""

from triplane.scheduler.compiler.autograd import autograd
from triplane.scheduler.compiler.dce import dce
from triplane.scheduler.compiler.memory import MemoryPlan, Step, plan_memory
from triplane.scheduler.compiler.pipeline import CompileOptions, Plan, PlanCache, canonicalize, compile_graph

__all__ = [
    "CompileOptions", "MemoryPlan", "Plan", "PlanCache", "Step", "autograd", "canonicalize",
    "compile_graph", "dce", "plan_memory",
]
