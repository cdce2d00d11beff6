"""The op table: every op by name. One table, which the built-in groups
(:mod:`triplane.proto.ops`, added by ``register_all`` when :mod:`triplane.proto` is
imported) and user ops (``triplane.sdk.custom``) fill. What an op declares is in
:mod:`triplane.proto.opdef`; this module does not import the groups, they do not
register themselves.
"""

from __future__ import annotations

from collections.abc import Mapping

from triplane.proto.errors import UnknownOpError
from triplane.proto.opdef import OpDef

__all__ = ["get", "names", "register", "table", "unregister"]

_TABLE: dict[str, OpDef] = {}


def register(op: OpDef, *, replace: bool = False) -> OpDef:
    """Add an op to the table. User ops call this too (see triplane.sdk.custom)."""
    if op.name in _TABLE and not replace:
        raise ValueError(f"op {op.name!r} is already registered")
    _TABLE[op.name] = op
    return op


def unregister(name: str) -> None:
    _TABLE.pop(name, None)


def get(name: str) -> OpDef:
    try:
        return _TABLE[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r} (see triplane.proto.optable.names() "
                             f"for the {len(_TABLE)} known ops)", op=name) from None


def names() -> list[str]:
    return sorted(_TABLE)


def table() -> Mapping[str, OpDef]:
    return dict(_TABLE)
