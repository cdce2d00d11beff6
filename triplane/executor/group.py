"""A grouped task's sub-graph, prepared once and run as a tight loop (docs/executor.md).

A ``graph`` task (``triplane.proto.packet.group``) carries a tiny job's whole plan. The
executor prepares its program once per distinct text -- parsed, each node's attributes
normalised and output type inferred from the declared input types (the sender's types
are never trusted: they are re-inferred here, as for a single task), the engine's support
checked, and for each step the values that die after it -- and keeps the result in a
small LRU keyed by the program text. A training loop sends the same program every step,
so a step costs one dict lookup before its kernels run. An engine with ``bind`` (the numpy
engine's, as ``executor/local.py``'s ``KernelList`` uses it) has each kernel call prepared
then too -- a small fused program planned once, no lookups per call -- and the steps run
under one ``np.errstate`` (``engine.run`` sets it per kernel).

Failures are :class:`GroupError` with the ``kind`` of a task failure (``user``: fails
the job; ``infra``: the task drifts whole to another node) and ``at``, the id of the
plan node (and ``op``) it is about, which the scheduler turns into the user's node name.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import GraphError, KernelError
from triplane.proto.ir import TensorType
from triplane.proto.packet.group import parse_program

__all__ = ["GroupError", "Prepared", "Programs", "prepare", "run_prepared"]


class GroupError(Exception):
    """A grouped task's failure of ``kind`` (``user`` / ``infra``) at plan node ``at``."""

    def __init__(self, kind: str, message: str, at: str | None = None, op: str | None = None) -> None:
        self.kind, self.at, self.op = kind, at, op
        super().__init__(message)


class Step(NamedTuple):
    id: str
    op: str
    inputs: tuple[int, ...]
    attrs: Any
    out: TensorType
    free: tuple[int, ...]  # slots no later step reads (never an output's)
    call: Any = None  # the engine's bound kernel (``bind``), else None: ``engine.run``


class Prepared(NamedTuple):
    in_types: tuple[TensorType, ...]
    steps: tuple[Step, ...]
    out: tuple[int, ...]
    out_types: tuple[TensorType, ...]
    ops: frozenset[str]
    touched: int  # bytes of every value made plus the inputs: the kernel pool's threshold
    flops: float = 0.0  # the op table's cost of every step: whether it runs with every core (blas.py)


def prepare(text: Any, n_in: int, n_out: int, engine: Any) -> Prepared:
    """The runnable form of a program (see the module doc); GroupError if it cannot run."""
    try:
        prog = parse_program(text, n_in, n_out)
    except ValueError as e:
        raise GroupError("user", str(e)) from None
    types: list[TensorType] = []
    for k, (shape, dtype) in enumerate(prog.inputs):
        try:
            types.append(TensorType(shape, dt.dtype(dtype)))
        except (GraphError, ValueError, TypeError) as e:
            raise GroupError("user", f"grouped task program: in[{k}]: {e}") from None
    in_types = tuple(types)
    last: dict[int, int] = {}
    for i, n in enumerate(prog.nodes):
        for s in n.inputs:
            last[s] = i
    keep = set(prog.out)
    dead: list[list[int]] = [[] for _ in prog.nodes]
    for s, i in last.items():
        if s >= n_in and s not in keep:
            dead[i].append(s)
    steps = []
    touched = sum(t.nbytes for t in in_types)
    bind = getattr(engine, "bind", None)
    flops = 0.0
    for i, n in enumerate(prog.nodes):
        try:
            op_def = optable.get(n.op)
            attrs = op_def.normalise_attrs(n.attrs)
            out_t = op_def.check([types[s] for s in n.inputs], attrs)
        except GraphError as e:
            raise GroupError("user", str(e), n.id, n.op) from None
        in_dtypes = [types[s].dtype.name for s in n.inputs]
        if not engine.supports(n.op, in_dtypes):
            raise GroupError("infra", f"engine {engine.name!r} does not support {n.op} on {in_dtypes}",
                             n.id, n.op)
        call = bind(n.op, attrs, out_t, [types[s] for s in n.inputs]) if bind is not None else None
        flops += op_def.cost([types[s] for s in n.inputs], out_t, attrs).flops
        types.append(out_t)
        touched += out_t.nbytes
        steps.append(Step(n.id, n.op, n.inputs, attrs, out_t, tuple(dead[i]), call))
    return Prepared(in_types, tuple(steps), prog.out, tuple(types[s] for s in prog.out),
                    frozenset(n.op for n in prog.nodes), touched, flops)


class Programs:
    """Prepared programs by their text, the ``capacity`` last used kept. A program that
    failed to prepare is not kept (its task fails; a corrected one is new text)."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, Prepared] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, text: Any, n_in: int, n_out: int, engine: Any) -> Prepared:
        kept = self._kept.get(text) if type(text) is str else None
        if kept is not None and len(kept.in_types) == n_in and len(kept.out) == n_out:
            self.hits += 1
            self._kept.move_to_end(text)
            return kept
        self.misses += 1
        prep = prepare(text, n_in, n_out, engine)
        self._kept[text] = prep
        if len(self._kept) > self.capacity:
            self._kept.popitem(last=False)
        return prep


def check_inputs(prep: Prepared, inputs: Sequence[np.ndarray]) -> None:
    """GroupError (user) when an input tile is not of the type the program declares."""
    for k, (a, t) in enumerate(zip(inputs, prep.in_types)):
        if a.shape != t.shape or a.dtype != t.dtype.np:
            raise GroupError("user", f"input {k} is {a.dtype}{list(a.shape)}, the grouped task declares "
                                     f"{t.dtype.name}{list(t.shape)}")


def run_prepared(prep: Prepared, inputs: Sequence[np.ndarray], engine: Any) -> list[np.ndarray]:
    """Run every step on ``engine``; the output values in ``out`` order. Intermediates are
    dropped after their last reader. GroupError naming the node whose kernel failed."""
    run = engine.run
    values: dict[int, np.ndarray] = dict(enumerate(inputs))
    slot = len(inputs)
    with np.errstate(all="ignore"):  # as engine.run sets it per kernel; the bound calls need it
        for step in prep.steps:
            try:
                args = [values[s] for s in step.inputs]
                call = step.call
                values[slot] = run(step.op, args, step.attrs, step.out) if call is None else call(args)
            except KernelError as e:
                raise GroupError("infra" if e.kind == "infra" else "user", str(e), step.id, step.op) from None
            except Exception as e:
                raise GroupError("infra", f"engine {engine.name!r} crashed: {type(e).__name__}: {e}",
                                 step.id, step.op) from None
            slot += 1
            for s in step.free:
                del values[s]
    return [values[s] for s in prep.out]
