"""The built-in op table, one module a group, in the order of the issue's list.

Each group module declares its ops in an ``OPS`` group and registers nothing; the table
(:mod:`triplane.proto.optable`) imports none of them. :func:`register_all` adds them,
once, when :mod:`triplane.proto` is imported.
"""

from triplane.proto import optable
from triplane.proto.opdef import OpGroup
from triplane.proto.ops import creation, elementwise, fused, linalg, nn, reduce, shape

__all__ = ["GROUPS", "register_all"]

GROUPS: tuple[OpGroup, ...] = tuple(m.OPS for m in (creation, elementwise, fused, linalg, nn, reduce, shape))


def register_all() -> None:
    """Add every built-in op to the table. Idempotent."""
    for group in GROUPS:
        for op in group.ops:
            optable.register(op, replace=True)
