"""The sub-graph a grouped task carries (``proto/packet.md``, "Grouped tasks").

A tiny job (its tensors total at most 4 MiB) runs as one task whose packet has op
``graph`` and one attribute, ``program``: the canonical JSON text of ::

    {"in": [[shape, dtype], ...],              # the declared type of each input tile
     "nodes": [[id, op, [slot, ...], attrs], ...],  # in an order that runs (inputs first)
     "out": [slot, ...],                        # the value stored as each output tile
     "v": 1}

Slots number the values: ``0 .. len(in) - 1`` are the packet's ``in`` tiles in order,
``len(in) + i`` is the result of ``nodes[i]``; a node reads only earlier slots. ``out[k]``
is the slot stored as the packet's ``out[k]`` tile; every one is a node's, and they are
distinct. ``id`` is the node's id in the job's plan, which errors name.

The program travels as one string, not as nested attributes: a receiver checks a string
attribute in one step and parses the program only when it has not seen that text before
(executors cache what they prepared from it by its text; docs/executor.md). The packet
is verified before any of it is read, as always.

:func:`parse_program` is the one reader; it raises ``ValueError`` saying what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from triplane.proto.packet.codec import canonical

__all__ = ["GROUP_OP", "MAX_PROGRAM_NODES", "PROGRAM_VERSION", "Program", "ProgramNode", "parse_program",
           "program_text"]

GROUP_OP = "graph"  # reserved: no op of the table has this name
PROGRAM_VERSION = 1
MAX_PROGRAM_NODES = 4096  # a receiver's bound; the scheduler groups far fewer (jobplan.MAX_GROUP_TASKS)


class ProgramNode(NamedTuple):
    id: str
    op: str
    inputs: tuple[int, ...]  # slots
    attrs: Mapping[str, Any]


class Program(NamedTuple):
    inputs: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each input slot
    nodes: tuple[ProgramNode, ...]
    out: tuple[int, ...]


def program_text(inputs: Sequence[tuple[Sequence[int], str]], nodes: Sequence[ProgramNode],
                 out: Sequence[int]) -> str:
    """The canonical JSON text of a program (the ``program`` attribute)."""
    doc = {"in": [[list(shape), dtype] for shape, dtype in inputs],
           "nodes": [[n.id, n.op, list(n.inputs), dict(n.attrs)] for n in nodes],
           "out": list(out), "v": PROGRAM_VERSION}
    return canonical(doc).decode()


def _fail(why: str) -> Any:
    raise ValueError(f"grouped task program: {why}")


def parse_program(text: Any, n_in: int, n_out: int) -> Program:
    """The program of a ``graph`` task with ``n_in`` input and ``n_out`` output tiles;
    ValueError naming what is wrong (not JSON, a slot out of range, a count that does not
    match the packet's ``in``/``out``)."""
    if type(text) is not str:
        _fail(f"expected a string, got {type(text).__name__}")
    try:
        doc = json.loads(text)
    except ValueError as e:
        _fail(f"not JSON: {e}")
    if type(doc) is not dict or set(doc) != {"in", "nodes", "out", "v"}:
        _fail("expected an object with exactly 'in', 'nodes', 'out' and 'v'")
    if doc["v"] != PROGRAM_VERSION:
        _fail(f"version {doc['v']!r} (this executor reads {PROGRAM_VERSION})")
    ins, nodes, out = doc["in"], doc["nodes"], doc["out"]
    if type(ins) is not list or len(ins) != n_in:
        _fail(f"'in' declares {len(ins) if type(ins) is list else '?'} inputs, the packet has {n_in}")
    types = []
    for k, t in enumerate(ins):
        if (type(t) is not list or len(t) != 2 or type(t[0]) is not list or type(t[1]) is not str
                or not all(type(d) is int and d >= 0 for d in t[0])):
            _fail(f"in[{k}] is not [shape, dtype]")
        types.append((tuple(t[0]), t[1]))
    if type(nodes) is not list or len(nodes) > MAX_PROGRAM_NODES:
        _fail(f"'nodes' must be a list of at most {MAX_PROGRAM_NODES}")
    parsed = []
    for i, n in enumerate(nodes):
        if (type(n) is not list or len(n) != 4 or type(n[0]) is not str or type(n[1]) is not str
                or type(n[2]) is not list or type(n[3]) is not dict):
            _fail(f"nodes[{i}] is not [id, op, [slot, ...], attrs]")
        limit = n_in + i
        for s in n[2]:
            if type(s) is not int or not 0 <= s < limit:
                _fail(f"nodes[{i}] ({n[0]!r}) reads slot {s!r}: only 0..{limit - 1} are made before it")
        parsed.append(ProgramNode(n[0], n[1], tuple(n[2]), n[3]))
    if type(out) is not list or len(out) != n_out:
        _fail(f"'out' names {len(out) if type(out) is list else '?'} values, the packet has {n_out} outputs")
    for s in out:
        if type(s) is not int or not n_in <= s < n_in + len(parsed):
            _fail(f"out slot {s!r} is not a node's value")
    if len(set(out)) != len(out):
        _fail("out slots must be distinct")
    return Program(tuple(types), tuple(parsed), tuple(out))
