"""``fused``: a chain of elementwise ops run as one node (made by the fusion pass),
optionally ending in the reduction that reads it.

``attrs.program`` is a list of steps ``[op, args, attrs]``; an arg ``k`` below the
number of inputs names input ``k``, otherwise the result of step ``k - len(inputs)``.
The last step's result is the node's value. Every step's op must be elementwise (or a
0-d ``full`` constant), and every step's result has one shape, the *body* shape, or is
0-d, so an engine can run the program over any slice of the body ("one pass over its
tiles"). The last step may instead be a *reduction epilogue*: a value reduction whose
partial results merge with a declared combine (sum, prod, max, min, mean: the op table's
``SplitDecl("reduce", combine)``), reading the step before it. The engine then reduces
each slice as it goes, and the body never exists whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from triplane.proto import optable
from triplane.proto.errors import AttrError, ShapeError, UnknownOpError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import Attr, Cost, OpDef, OpGroup, SplitDecl

OPS = OpGroup("fused")  # registered by triplane.proto.ops.register_all


def is_reduction(op: str) -> bool:
    """Whether ``op`` may end a fused program: a value reduction with a combine."""
    try:
        split = optable.get(op).split
    except UnknownOpError:  # a user op known only to the executors
        return False
    return split is not None and split.kind == "reduce" and split.combine is not None


def reduce_step(a: Attrs) -> tuple[str, Attrs] | None:
    """The program's reduction epilogue ``(op, attrs)``, or None (an elementwise program)."""
    op, _, attrs = a["program"][-1]
    return (op, optable.get(op).normalise_attrs(attrs)) if is_reduction(op) else None


def program_types(ins: Sequence[TensorType], a: Attrs) -> list[TensorType]:
    """The type of every step of a fused program (checking each step as its op would)."""
    program = a["program"]
    if not isinstance(program, tuple) or not program:
        raise AttrError(f"attribute 'program' must be a non-empty list of steps, got {program!r}")
    types: list[TensorType] = list(ins)
    for k, step in enumerate(program):
        if not (isinstance(step, tuple) and len(step) == 3 and isinstance(step[0], str)
                and isinstance(step[1], tuple) and isinstance(step[2], Attrs)):
            raise AttrError(f"program step {k} must be [op, [args], {{attrs}}], got {step!r}")
        op, args, attrs = step
        opdef = optable.get(op)
        last = k == len(program) - 1
        if not opdef.elementwise and op != "full":
            if not (last and is_reduction(op)):
                raise AttrError(f"program step {k}: {op} is not elementwise (only the last step may be a "
                                "reduction with a combine: sum, prod, max, min, mean)")
            if args != (len(types) - 1,) or k == 0:
                raise AttrError(f"program step {k}: the reduction {op} must read the step before it")
        for arg in args:
            if not isinstance(arg, int) or isinstance(arg, bool) or not 0 <= arg < len(types):
                raise AttrError(f"program step {k}: argument {arg!r} names no earlier value")
        types.append(opdef.check([types[i] for i in args], opdef.normalise_attrs(attrs)))
    return types[len(ins):]


def body_type(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    """The type of the elementwise part's result (the reduction's input, if any)."""
    steps = program_types(ins, a)
    return steps[-2] if reduce_step(a) is not None else steps[-1]


def _infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    steps = program_types(ins, a)
    reduced = reduce_step(a) is not None
    body = steps[-2] if reduced else steps[-1]
    for k, t in enumerate(steps[:-2] if reduced else steps[:-1]):
        if t.shape not in (body.shape, ()):
            raise ShapeError(f"program step {k} has shape {t.shape}, not the body's {body.shape}")
    return steps[-1]


# A step's pass over a slice that stays in cache costs less than a pass over memory, but
# it is compute: numpy here ran exp(x * 2 + 1).sum() of 4096 x 8192 float32 in 49 ms alone
# and in 66-73 ms with the other executor computing too (this machine's two vCPUs share
# execution units; a memory-bound add ran 12 GB/s either way). Counting every step's
# pass at 3/4 of the streaming rate predicts 70 ms at 12 GB/s; every pass in full, 94 ms;
# only the bytes read, 13 ms.
IN_CACHE_PASS = 0.75


def _cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    """The steps' flops, summed; bytes: the inputs read and the output written, plus each
    step's own traffic at ``IN_CACHE_PASS`` of its weight (the temporaries are slices that
    stay in cache, but the engine still passes over every element once per step)."""
    types = list(ins) + program_types(ins, a)
    flops = steps = 0.0
    for k, (op, args, attrs) in enumerate(a["program"]):
        c = optable.get(op).cost([types[i] for i in args], types[len(ins) + k], attrs)
        flops += c.flops
        steps += c.bytes
    return Cost(flops, float(sum(t.nbytes for t in ins) + out.nbytes) + IN_CACHE_PASS * steps)


OPS.declare(OpDef("fused", "fused", None, _infer, attrs={"program": Attr("any")},
                  cost=_cost, internal=True, split=SplitDecl("fused"),
                  doc="A fused chain of elementwise ops, optionally ending in a reduction (see the "
                   "module doc)."))
