"""Normalising an op's attributes and inferring its result type when the SDK records it,
memoised: a training loop records the same ops on the same types every step, and
normalising and inferring them again was a third of recording a step. The inference is
the op table's (``triplane.proto.infer.infer_node``, the one the scheduler completes a
submitted graph's types with).

The memo maps op -> (its OpDef, {(input types, attributes): (normalised attributes, result
type)}). Only successes are kept (errors are raised afresh), and only for attributes whose
values compare exactly (:func:`infer_key`); a re-registered op starts a new memo.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from triplane.proto import optable
from triplane.proto.errors import GraphError
from triplane.proto.infer import infer_node
from triplane.proto.ir import Attrs, TensorType

__all__ = ["infer", "infer_key"]

MEMO_CAP = 4096  # entries per op; the memo of an op is cleared when full


class Typed(Protocol):
    _type: TensorType


_INFERRED: dict[str, tuple[Any, dict[Any, tuple[Attrs, TensorType]]]] = {}
_EXACT = (str, int, bool, type(None))


def infer(op: str, inputs: Sequence[Typed], attrs: Mapping[str, Any],
          where: str | None) -> tuple[Attrs, TensorType]:
    """``op``'s normalised attributes and result type on ``inputs``; a GraphError names
    the op and ``where`` (the user's line)."""
    opdef = optable.get(op)
    key = infer_key(inputs, attrs)
    memo = _INFERRED.get(op)
    if memo is None or memo[0] is not opdef:
        memo = _INFERRED[op] = (opdef, {})
    found = memo[1].get(key) if key is not None else None
    if found is not None:
        return found
    try:
        a, t = infer_node(op, [x._type for x in inputs], attrs)
    except GraphError as e:
        e.at(op=op, where=where)
        raise e.with_traceback(None) from None
    if key is not None:
        if len(memo[1]) >= MEMO_CAP:
            memo[1].clear()
        memo[1][key] = (a, t)
    return a, t


def infer_key(inputs: Sequence[Typed], attrs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A hashable key equal only for inputs of the same shapes and dtypes and attributes
    of the same values and types (floats by their bits, so -0.0 is not 0.0), or None when
    an attribute is of another kind (then nothing is memoised)."""
    key: list[Any] = [(x._type.shape, x._type.dtype.name) for x in inputs]
    for k, v in attrs.items():
        tv = type(v)
        if tv is float:
            key.append((k, v.hex()))
        elif tv in _EXACT or (tv is tuple and all(type(e) is int for e in v)):
            key.append((k, tv, v))
        else:
            return None
    return tuple(key)
