"""A tiny job as one grouped task (pure): the planning decision and the task's packet form.

Every task costs a packet round trip (some 0.3 ms on a local cluster) and, when
neighbours land on different executors, a transfer. A training step of small layers is
60-80 plan nodes of a few microseconds of compute each, so one task per node spends
nearly all of its time in dispatch. A job whose plan is *tiny* -- the untiled path (its
tensors total at most ``layout.UNSPLIT_BYTES``, or it stays whole on the cluster it was
laid out for: ``layout.stays_whole``) with 2 to ``MAX_GROUP_TASKS`` task nodes --
therefore runs as one task, :data:`GROUP_TASK`, on one executor: op ``graph``, whose
``program`` attribute is the plan (``triplane.proto.packet.group``), its inputs the job's
input tiles, its outputs one tile per graph output, named ``<job>.<node>`` exactly as the
per-node tasks' would be. The executor runs the program as a loop and frees dead values
as it goes (docs/executor.md).

Not grouped: a tiled job (its tasks are spread on purpose), a job of one task (nothing to
gain), a job of more than ``MAX_GROUP_TASKS`` tasks (per-task dispatch benchmarks and
jobs of thousands of scalar tasks keep their parallelism and their per-task progress), a
job with no output to keep, and a program whose text does not fit a packet's attributes
(``MAX_ATTRS_BYTES``). The decision reads the plan and, for a job over
``UNSPLIT_BYTES``, the layout's verdict for the cluster, which the job's record keeps
(``"whole"`` in its ``job.bindings``), so a restarted scheduler compiling a stored job
again gets the same tasks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from triplane.proto.packet import canonical
from triplane.proto.packet.group import GROUP_OP, ProgramNode, program_text
from triplane.proto.values import TensorType
from triplane.scheduler.compiler.layout import UNSPLIT_BYTES, bigger_than
from triplane.scheduler.compiler.pipeline import Plan
from triplane.scheduler.dispatch.state import TaskSpec

__all__ = ["GROUP_OP", "GROUP_TASK", "MAX_GROUP_TASKS", "Group", "grouped"]

GROUP_TASK = "g"  # the grouped task's id: no plan node (n0, n1, ...) or tile task (t0, ...) has it
MAX_GROUP_TASKS = 256


class Template(Protocol):
    """What is read of a per-node task's template (``jobplan.TaskTemplate``)."""

    op: str
    inputs: tuple[str, ...]
    uploads: tuple[str, ...]
    attrs: Mapping[str, Any]
    out: TensorType


class Group(NamedTuple):
    """A grouped task: its spec, input tiles, those pulled from the scheduler, attributes,
    the type of its first output, and the plan nodes whose tiles it stores."""

    spec: TaskSpec
    inputs: tuple[str, ...]
    pulled: tuple[str, ...]
    attrs: dict[str, str]
    out: TensorType
    tiles: tuple[str, ...]

# (id(plan), input slot keys) -> (plan, program text, its size as an attribute): a training loop
# submits the same plan every step, and its canonical text costs ~0.3 ms to write.
_TEXTS: OrderedDict[tuple[int, tuple[Any, ...]], tuple[Plan, str, int]] = OrderedDict()
_TEXTS_KEPT = 128


def grouped(job: str, plan: Plan, uploads: Mapping[str, str], specs: Sequence[TaskSpec],
            templates: Mapping[str, Template], *, untiled: bool, max_attrs_bytes: int,
            whole: bool = False) -> Group | None:
    """The grouped task of a job, built from the per-node ``specs``/``templates`` of
    ``plan`` (``uploads``: input node -> uploaded tensor id); None when the job is not
    grouped (the module doc), its program's attributes over ``max_attrs_bytes`` included.
    ``whole``: laid out uncut for a cluster, so its size was judged there already."""
    if not untiled or not 2 <= len(specs) <= MAX_GROUP_TASKS or \
            (not whole and bigger_than(plan.graph, UNSPLIT_BYTES)):
        return None
    g = plan.graph
    outs = [o for o in dict.fromkeys(g.outputs) if o in templates]
    if not outs:
        return None
    order = [s.node for s in plan.memory.steps if s.node in templates]
    if len(order) != len(templates):
        return None  # not a plan of this graph's tasks (cannot happen for a compiled plan)
    prefix = job + "."
    slot: dict[str, int] = {}  # a node's value -> its slot
    in_keys: list[Any] = []  # per input slot: (input node, the tile's suffix past the upload id)
    in_tiles: list[str] = []
    in_types: list[tuple[tuple[int, ...], str]] = []
    in_slot: dict[Any, int] = {}
    pulled: dict[str, None] = {}
    nodes: list[tuple[str, str, list[Any], Mapping[str, Any]]] = []
    for nid in order:
        tpl = templates[nid]
        refs: list[Any] = []
        for k, tile in enumerate(tpl.inputs):
            if tile.startswith(prefix):
                refs.append(tile[len(prefix):])
                continue
            src = g.nodes[nid].inputs[k]
            whole = uploads.get(src)
            key = (src, tile[len(whole):] if whole is not None and tile.startswith(whole) else tile)
            if key not in in_slot:
                in_slot[key] = len(in_tiles)
                in_keys.append(key)
                in_tiles.append(tile)
                # a region tile is read by an identity slice: its type is the slice's
                t = g.nodes[src].type if tile == whole else tpl.out
                in_types.append((tuple(t.shape), t.dtype.name))
            if tile in tpl.uploads:
                pulled[tile] = None
            refs.append(in_slot[key])
        nodes.append((nid, tpl.op, refs, tpl.attrs))
    n_in = len(in_tiles)
    for i, (nid, _, _, _) in enumerate(nodes):
        slot[nid] = n_in + i
    key = (id(plan), tuple(in_keys))
    kept = _TEXTS.get(key)
    if kept is not None and kept[0] is plan:
        _TEXTS.move_to_end(key)
        text, size = kept[1], kept[2]
    else:
        program = [ProgramNode(nid, op, tuple(r if type(r) is int else slot[r] for r in refs), attrs)
                   for nid, op, refs, attrs in nodes]
        text = program_text(in_types, program, [slot[o] for o in outs])
        size = len(canonical({"program": text}))
        _TEXTS[key] = (plan, text, size)
        if len(_TEXTS) > _TEXTS_KEPT:
            _TEXTS.popitem(last=False)
    if size > max_attrs_bytes:
        return None
    cost = sum(s.cost_s for s in specs)
    out_bytes = sum(templates[o].out.nbytes for o in outs)
    spec = TaskSpec(GROUP_TASK, GROUP_OP, (), cost, out_bytes, True, None, 0.0)
    return Group(spec, tuple(in_tiles), tuple(pulled), {"program": text}, templates[outs[0]].out, tuple(outs))
