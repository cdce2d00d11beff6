"""From a submitted graph to the dispatcher's tasks: pure functions, no I/O.

Without tiling (docs/runtime.md), every non-input node of the compiled, canonical plan
graph is one task computing one whole tensor (one tile):

* task id = the plan node id (``n0``, ``n17``, ...); its output tile is ``<job>.<task>``;
* an ``input`` node is no task: its tile is the uploaded tensor (``u-<32 hex>``), held by
  the scheduler's data server, which packets name as node ``scheduler``;
* a task's ``deps`` are its inputs that are tasks; its cost comes from the op table's
  cost at a nominal rate (``NOMINAL_FLOPS`` / ``NOMINAL_BYTES_PER_S``).

``build_job`` raises :class:`~triplane.proto.errors.GraphError` (naming the user's node
and op) for anything wrong with the graph or the fetch list, before anything is stored.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triplane.proto import optable
from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph, TensorType, thaw
from triplane.proto.packet import canonical
from triplane.proto.validate import Limits
from triplane.scheduler.compiler.pipeline import CompileOptions, Plan, PlanCache, canonicalize
from triplane.scheduler.dispatch.state import TaskSpec

NOMINAL_FLOPS = 1e9  # per second: a modest core; deadlines are 10x the cost anyway
NOMINAL_BYTES_PER_S = 2e9
SCHEDULER_NODE = "scheduler"
MAX_ATTRS_BYTES = 48 * 1024  # a task packet is at most 64 KiB framed; leave room for the rest

_JOB_ID = re.compile(r"j[0-9a-f]{16}")
_TENSOR_ID = re.compile(r"u-[0-9a-f]{32}")


def new_job_id() -> str:
    """``j`` + 16 lowercase hex digits."""
    return "j" + secrets.token_hex(8)


def new_tensor_id() -> str:
    """``u-`` + 32 lowercase hex digits: an uploaded tensor."""
    return "u-" + secrets.token_hex(16)


def is_job_id(s: str) -> bool:
    return _JOB_ID.fullmatch(s) is not None


def is_tensor_id(s: str) -> bool:
    return _TENSOR_ID.fullmatch(s) is not None


def tile_id(job: str, task: str) -> str:
    """The id of a task's output tile."""
    return f"{job}.{task}"


@dataclass(frozen=True)
class TaskTemplate:
    """What a task packet needs besides its attempt, deadline and peer pulls."""

    op: str
    inputs: tuple[str, ...]  # input tile ids in argument order
    uploads: tuple[str, ...]  # those of ``inputs`` that are uploads (pulled from the scheduler)
    attrs: Mapping[str, Any]  # JSON-ready
    out: TensorType


@dataclass(frozen=True)
class JobPlan:
    """A job ready for the dispatcher. ``fetch`` maps each fetched name of the submitted
    graph to the plan node holding its value (a task id, or an ``input`` node)."""

    job: str
    plan: Plan
    specs: tuple[TaskSpec, ...]
    templates: Mapping[str, TaskTemplate]
    uploads: Mapping[str, str]  # plan input node -> uploaded tensor id
    fetch: Mapping[str, str]
    ops: frozenset[str]
    back: Mapping[str, str]  # plan node id -> submitted node id (errors name the user's)

    def fetch_tile(self, name: str) -> tuple[str, str | None]:
        """(tile id, task id or None for an upload) of a fetched name; KeyError if not fetched."""
        nid = self.fetch[name]
        if nid in self.uploads:
            return self.uploads[nid], None
        return tile_id(self.job, nid), nid


def cost_seconds(flops: float, nbytes: float) -> float:
    return flops / NOMINAL_FLOPS + nbytes / NOMINAL_BYTES_PER_S


def with_fetch(graph: Graph, fetch: Sequence[str]) -> Graph:
    """``graph`` with every fetched node among its outputs (GraphError for an unknown name)."""
    for i, name in enumerate(fetch):
        if not isinstance(name, str) or name not in graph.nodes:
            raise GraphError(f"fetch[{i}] = {name!r} is not a node of the graph", node=str(name))
    extra = [n for n in dict.fromkeys(fetch) if n not in graph.outputs]
    return Graph(graph.nodes, (*graph.outputs, *extra), graph.version) if extra else graph


def prepare(graph: Graph, fetch: Sequence[str]) -> tuple[Graph, dict[str, str], list[str]]:
    """(canonical graph, submitted id -> canonical id, uploaded tensor ids by ``argN``) of
    ``graph`` with ``fetch`` among its outputs. GraphError for dangling inputs or cycles."""
    return canonicalize(with_fetch(graph, fetch))


def build_job(
    job: str,
    graph: Graph,
    fetch: Sequence[str],
    cache: PlanCache,
    *,
    limits: Limits | None = None,
    options: CompileOptions | None = None,
) -> JobPlan:
    """Compile the canonical form of ``graph`` through ``cache`` and turn the plan into task
    specs; errors name the submitted node ids."""
    cgraph, rename, args = prepare(graph, fetch)
    return plan_job(
        job,
        cgraph,
        args,
        {name: rename[name] for name in fetch},
        {v: k for k, v in rename.items()},
        cache,
        limits=limits,
        options=options,
    )


def plan_job(
    job: str,
    cgraph: Graph,
    args: Sequence[str],
    fetch: Mapping[str, str],
    back: Mapping[str, str],
    cache: PlanCache,
    *,
    limits: Limits | None = None,
    options: CompileOptions | None = None,
) -> JobPlan:
    """The job of a canonical graph: ``args`` binds ``argN`` inputs to uploaded tensor ids,
    ``fetch`` maps fetched names to canonical ids, ``back`` canonical ids to submitted ones."""
    if options is None:
        options = CompileOptions(limits=limits) if limits else CompileOptions()
    try:
        return _plan_job(job, cgraph, args, fetch, back, cache, options)
    except _PacketTooSmall:
        # Fusion made a program too big for one packet: run the chain unfused instead.
        return _plan_job(job, cgraph, args, fetch, back, cache, dataclasses.replace(options, fuse=False))


class _PacketTooSmall(GraphError):
    pass


def _plan_job(
    job: str,
    cgraph: Graph,
    args: Sequence[str],
    fetch: Mapping[str, str],
    back: Mapping[str, str],
    cache: PlanCache,
    options: CompileOptions,
) -> JobPlan:
    try:
        plan = cache.get_or_compile(cgraph, options)
    except GraphError as e:
        raise _renamed(e, back) from None
    g = plan.graph
    uploads: dict[str, str] = {}
    for nid, node in g.nodes.items():
        if node.op == "input":
            tensor = args[int(str(node.attrs["tensor"])[3:])]
            if not is_tensor_id(tensor):
                raise GraphError(
                    f"input tensor {tensor!r} is not an uploaded tensor id (u-<32 hex>)",
                    node=back.get(nid, nid),
                    op="input",
                )
            uploads[nid] = tensor
    outputs = set(g.outputs)
    specs: list[TaskSpec] = []
    templates: dict[str, TaskTemplate] = {}
    for nid, node in g.nodes.items():
        if node.op == "input":
            continue
        opdef = optable.get(node.op)
        c = opdef.cost([g.nodes[i].type for i in node.inputs], node.type, node.attrs)
        attrs = thaw(node.attrs) if node.attrs else {}
        if attrs and len(canonical(attrs)) > MAX_ATTRS_BYTES:
            raise (_PacketTooSmall if node.op == "fused" and options.fuse else GraphError)(
                f"attributes of {len(canonical(attrs))} bytes do not fit a task packet "
                f"(at most {MAX_ATTRS_BYTES}); upload large data as a tensor",
                node=back.get(nid, nid),
                op=node.op,
            )
        in_tiles = tuple(uploads[i] if i in uploads else tile_id(job, i) for i in node.inputs)
        deps = tuple(dict.fromkeys(i for i in node.inputs if i not in uploads))
        specs.append(
            TaskSpec(nid, node.op, deps, cost_seconds(c.flops, c.bytes), node.type.nbytes, nid in outputs)
        )
        templates[nid] = TaskTemplate(
            node.op,
            in_tiles,
            tuple(dict.fromkeys(uploads[i] for i in node.inputs if i in uploads)),
            attrs,
            node.type,
        )
    return JobPlan(
        job,
        plan,
        tuple(specs),
        templates,
        uploads,
        dict(fetch),
        frozenset(t.op for t in templates.values()),
        dict(back),
    )


def _renamed(e: GraphError, back: Mapping[str, str]) -> GraphError:
    """``e`` naming the submitted node instead of the canonical one."""
    if e.node is None:
        return e
    return type(e)(e.reason, node=back.get(e.node, e.node), op=e.op, where=e.where)


def unsupported_op(ops: Iterable[str], engine_ops: Iterable[Iterable[str]]) -> str | None:
    """The first op (sorted) no registered engine lists, else None."""
    known: set[str] = set()
    for e in engine_ops:
        known.update(e)
    return next((op for op in sorted(ops) if op not in known), None)
