"""``fused``: a chain of elementwise ops run as one node (made by the fusion pass).

``attrs.program`` is a list of steps ``[op, args, attrs]``; an arg ``k`` below the
number of inputs names input ``k``, otherwise the result of step ``k - len(inputs)``.
The last step's result is the node's value. Every step's op must be elementwise (or a
0-d ``full`` constant), and every step's result has the node's shape, so an engine can
run the program over any slice of the output ("one pass over its tiles").
"""

from __future__ import annotations

from collections.abc import Sequence

from triplane.proto import optable
from triplane.proto.errors import AttrError, ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.optable import Attr, Cost, OpDef, SplitDecl, register


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
        if not opdef.elementwise and op != "full":
            raise AttrError(f"program step {k}: {op} is not elementwise")
        for arg in args:
            if not isinstance(arg, int) or isinstance(arg, bool) or not 0 <= arg < len(types):
                raise AttrError(f"program step {k}: argument {arg!r} names no earlier value")
        types.append(opdef.check([types[i] for i in args], opdef.normalise_attrs(attrs)))
    return types[len(ins):]


def _infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    steps = program_types(ins, a)
    out = steps[-1]
    for k, t in enumerate(steps[:-1]):
        if t.shape not in (out.shape, ()):
            raise ShapeError(f"program step {k} has shape {t.shape}, not the result's {out.shape}")
    return out


def _cost(ins: Sequence[TensorType], out: TensorType, a: Attrs) -> Cost:
    flops = 0.0
    for (op, args, attrs), t in zip(a["program"], program_types(ins, a)):
        flops += optable.get(op).cost([t] * len(args), t, attrs).flops
    return Cost(flops, float(sum(t.nbytes for t in ins) + out.nbytes))


register(OpDef("fused", "fused", None, _infer, attrs={"program": Attr("any")}, cost=_cost,
               internal=True, split=SplitDecl("elementwise"),
               doc="A fused chain of elementwise ops (see the module doc)."))
