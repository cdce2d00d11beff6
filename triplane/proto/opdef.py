"""What an op declares: :class:`OpDef` and its parts (attribute schemas, cost, split,
gradient context), and the helpers the group modules share.

Each op is declared once, in a group module under :mod:`triplane.proto.ops`, with its
signature (arity, accepted dtypes, attribute schema), shape/dtype inference, gradient
rule, cost estimate and properties (elementwise, random, view) side by side. A group
module collects its declarations in an :class:`OpGroup`; the table
(:mod:`triplane.proto.optable`) holds them. Kernels live with the engines, never here.

A gradient rule is a function ``rule(b, node, g) -> list[Ref | None]``: ``b`` is a
:class:`~triplane.proto.builder.Builder` that appends ops to the graph under
differentiation, ``node`` is a :class:`GradCtx` (the node's input refs, its output ref
and attrs) and ``g`` the ref of the gradient flowing into the output. It returns one
gradient ref per input (None where no gradient flows, e.g. integer labels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from triplane.proto import dtypes as dt
from triplane.proto.errors import AttrError, DTypeError, GraphError, ShapeError
from triplane.proto.ir import Attrs, TensorType, freeze

if TYPE_CHECKING:
    from triplane.proto.builder import Builder, Ref

REQUIRED: Any = object()


@dataclass(frozen=True)
class Attr:
    """One attribute's schema. ``kind`` is one of: int, float, bool, str, ints, floats,
    axes (None, an int or a list of ints), shape, dtype, any. ``check`` may reject a value
    by returning an explanation."""

    kind: str
    default: Any = REQUIRED
    check: Callable[[Any], str | None] | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False

    def normalise(self, name: str, value: Any) -> Any:
        if value is None and (self.nullable or self.kind in ("axes", "any")):
            return None
        v = _coerce(self.kind, value)
        if v is _BAD:
            raise AttrError(f"attribute {name!r} must be {_KIND_TEXT[self.kind]}, got {value!r}")
        if self.choices is not None and v not in self.choices:
            raise AttrError(f"attribute {name!r} must be one of {list(self.choices)}, got {value!r}")
        if self.check is not None:
            why = self.check(v)
            if why:
                raise AttrError(f"attribute {name!r}={value!r}: {why}")
        return v


_BAD = object()
_KIND_TEXT = {
    "int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
    "ints": "a list of integers", "floats": "a list of numbers",
    "axes": "an axis or a list of axes (or null for all)", "shape": "a list of non-negative integers",
    "dtype": f"a dtype name ({', '.join(dt.BY_NAME)})", "any": "a value",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _coerce(kind: str, v: Any) -> Any:
    if kind == "int":
        return int(v) if _is_int(v) else _BAD
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return _BAD
        return float(v)
    if kind == "bool":
        return v if isinstance(v, bool) else _BAD
    if kind == "str":
        return v if isinstance(v, str) else _BAD
    if kind in ("ints", "shape"):
        if not isinstance(v, (list, tuple)) or not all(_is_int(x) for x in v):
            return _BAD
        if kind == "shape" and any(x < 0 for x in v):
            return _BAD
        return tuple(int(x) for x in v)
    if kind == "floats":
        if not isinstance(v, (list, tuple)) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return _BAD
        return tuple(float(x) for x in v)
    if kind == "axes":
        if _is_int(v):
            return (int(v),)
        if isinstance(v, (list, tuple)) and all(_is_int(x) for x in v):
            return tuple(int(x) for x in v)
        return _BAD
    if kind == "dtype":
        if isinstance(v, dt.DType):
            return v.name
        return v if isinstance(v, str) and v in dt.BY_NAME else _BAD
    if kind == "any":
        return v
    raise AssertionError(f"unknown attribute kind {kind}")


class Cost(NamedTuple):
    """Work of one op application: floating-point operations and bytes read + written."""

    flops: float
    bytes: float


@dataclass(frozen=True)
class GradCtx:
    """What a gradient rule sees of the node it differentiates."""

    inputs: tuple[Ref, ...]
    out: Ref
    attrs: Attrs


GradRule = Callable[["Builder", GradCtx, "Ref"], Sequence["Ref | None"]]
InferFn = Callable[[Sequence[TensorType], Attrs], TensorType]
CostFn = Callable[[Sequence[TensorType], TensorType, Attrs], Cost]


def elementwise_cost(flops_per_element: float = 1.0) -> CostFn:
    def cost(ins: Sequence[TensorType], out: TensorType, attrs: Attrs) -> Cost:
        return Cost(flops_per_element * out.size, sum(t.nbytes for t in ins) + out.nbytes)

    return cost


def default_cost(ins: Sequence[TensorType], out: TensorType, attrs: Attrs) -> Cost:
    return Cost(float(max(out.size, sum(t.size for t in ins))), sum(t.nbytes for t in ins) + out.nbytes)


@dataclass(frozen=True)
class SplitDecl:
    """How an op may be split into tiles, declared next to its inference and cost.

    ``kind`` names a split rule that the tiling pass implements
    (triplane/scheduler/compiler/tiling/rules.py lists the kinds; docs/tiling.md explains
    them). ``combine`` is the binary op that sums partial results when the op is split
    along a contracted axis (matmul's K, a reduction's reduced axes): "add", "mul",
    "maximum" or "minimum"; None means the op is never split that way.
    """

    kind: str
    combine: str | None = None


@dataclass(frozen=True)
class OpDef:
    """One op of the table.

    ``arity`` is the number of inputs, or None for one-or-more (concat, stack).
    ``dtypes`` are the input dtypes accepted (checked before inference).
    ``grad`` None means the op is not differentiable; ``nograd_inputs`` lists inputs that
    never carry a gradient (indices, labels) so asking for them is an error.
    ``elementwise`` ops may be fused into one pass; ``random`` ops are pure functions of
    their seed (so tiles of them can be made anywhere); ``source`` ops take no inputs.
    ``split`` says how the tiling pass may cut the op into tiles (None: never; the op runs
    whole, as one tile). ``view`` ops return a view of their input (the same bytes seen
    differently: slice, transpose, broadcast_to), O(1) however big the tile: an engine
    that can return a view runs them inline, and the cost model charges them only the
    dispatch overhead.
    """

    name: str
    group: str
    arity: int | None
    infer: InferFn
    attrs: Mapping[str, Attr] = field(default_factory=dict)
    dtypes: frozenset[str] = dt.EVERY
    grad: GradRule | None = None
    nograd_inputs: frozenset[int] = frozenset()
    cost: CostFn = default_cost
    elementwise: bool = False
    random: bool = False
    internal: bool = False
    split: SplitDecl | None = None
    view: bool = False
    doc: str = ""

    @property
    def differentiable(self) -> bool:
        return self.grad is not None

    def normalise_attrs(self, attrs: Mapping[str, Any]) -> Attrs:
        """Apply the schema: defaults filled, types coerced, unknown names rejected."""
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            known = sorted(self.attrs) or "none"
            raise AttrError(f"unknown attribute(s) {sorted(unknown)} (known: {known})", op=self.name)
        out: dict[str, Any] = {}
        for name, spec in self.attrs.items():
            if name in attrs:
                v = spec.normalise(name, attrs[name])
                # Coerced kinds come back frozen (tuples, scalars); "any" passes values through.
                out[name] = freeze(v) if spec.kind == "any" else v
            elif spec.default is REQUIRED:
                raise AttrError(f"missing required attribute {name!r}", op=self.name)
            else:
                out[name] = freeze(spec.default)
        return Attrs.frozen(out)

    def check(self, ins: Sequence[TensorType], attrs: Attrs) -> TensorType:
        """Arity and dtype checks, then inference. Attrs must be normalised already."""
        if self.arity is None:
            if len(ins) < 1:
                raise GraphError("needs at least one input", op=self.name)
        elif len(ins) != self.arity:
            raise GraphError(f"takes {self.arity} input(s), got {len(ins)}", op=self.name)
        for i, t in enumerate(ins):
            if t.dtype.name not in self.dtypes:
                raise DTypeError(
                    f"input {i} has dtype {t.dtype.name}, which {self.name} does not accept "
                    f"(accepted: {', '.join(sorted(self.dtypes))})", op=self.name)
        try:
            out = self.infer(ins, attrs)
        except GraphError as e:
            raise e.at(op=self.name) from None
        return TensorType(tuple(int(s) for s in out.shape), out.dtype)


class OpGroup:
    """The ops one group module declares, in order. The module does not register them:
    :func:`triplane.proto.ops.register_all` adds every group to the table."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ops: list[OpDef] = []

    def declare(self, op: OpDef) -> OpDef:
        self.ops.append(op)
        return op


# --- helpers shared by the group modules ------------------------------------------------


def normalise_axis(axis: int, ndim: int, what: str = "axis") -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ShapeError(f"{what} {axis} is out of range for a {ndim}-d tensor")
    return axis % max(ndim, 1)


def normalise_axes(axes: tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    out = tuple(sorted(normalise_axis(a, ndim) for a in axes)) if ndim else ()
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {list(axes)}")
    return out


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcasting rule, with an error naming the shapes that do not fit."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        dim = 1
        for s in shapes:
            d = s[i - nd + len(s)] if i - nd + len(s) >= 0 else 1
            if d != 1:
                if dim not in (1, d):
                    from triplane.proto.errors import ShapeError

                    raise ShapeError("shapes " + " and ".join(str(tuple(x)) for x in shapes)
                                     + " do not broadcast")
                dim = d
        out.append(dim)
    return tuple(out)


def size_of(shape: Sequence[int]) -> int:
    return math.prod(shape)
