"""The codec's fast writers (``codec._task_body_checked``, ``codec._reply_body_checked``):
same bytes as the general path, and never a packet the decoder refuses."""

from __future__ import annotations

import json
import math
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triplane.proto import packet as pk
from triplane.proto.packet import codec, schema

SECRET = b"triplane-test-secret-NOT-FOR-PRODUCTION"
GOOD_TASK = pk.TaskPacket("j0123.t7.a0", "full", ("j0123.t1", "j0123.t1", "u-ab@0:2"), ("j0123.t7",),
                          1795307742.1326063, {"u-ab@0:2": "scheduler"},
                          {"value": 0.5, "shape": [2, 3], "dtype": "float32", "k": {"n": [None, True]}},
                          "host-1:n7", 1795307712.125)
GOOD_REPLY = pk.Reply("j0123.t7.a0", True, pk.Timings(1795307712.25, 1795307712.5, 1795307712.75),
                      (pk.TileInfo("j0123.t7", (2, 3), "float32", 24),))



def mostly(good: Any, *bad: Any) -> st.SearchStrategy[Any]:
    """``good`` most of the time, else one of ``bad``."""
    return st.sampled_from([good] * 6 + list(bad))


# Near-valid fields: mostly valid values, with the mistakes a sender can make mixed in.
good_ids = ["a", "j1.t2", "u-ab@0:2", "n~1", "x" * 128]
any_ids = st.sampled_from(good_ids * 8 + ["", "has space", "quo\"te", "x" * 129, "é", 7, None])
numbers = st.floats(-4e9, 4e9) | st.sampled_from([1.5, 1e16, 1.5e-7, math.inf, -math.inf, math.nan, 17,
                                                 True, 2**70, "1.0"])
good_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(2**63), 2**63 - 1) | st.text(st.characters(blacklist_categories=("Cs",)), max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(st.text(max_size=3), inner,
                                                                                  max_size=3),
    max_leaves=8)
DEEP: Any = 0
for _ in range(schema.MAX_DEPTH):
    DEEP = [DEEP]
# One mistake, nested at some depth: what the writer must send to the explaining path.
bad_leaf = st.sampled_from([math.nan, math.inf, 2**63, -(2**63) - 1, object(), "\ud800", {1: 0}, {None: 0},
                            {"k" * 129: 0}, DEEP])
bad_values = st.recursive(bad_leaf, lambda inner: st.lists(inner, min_size=1, max_size=1)
                          | st.dictionaries(st.text(max_size=3), inner, min_size=1, max_size=1), max_leaves=3)
attrs_maps = st.dictionaries(st.text(max_size=3), good_values, max_size=3) | st.builds(
    lambda good, k, bad: {**good, k: bad}, st.dictionaries(st.text(max_size=3), good_values, max_size=2),
    st.text(max_size=3), bad_values)


@st.composite
def near_tasks(draw: st.DrawFn) -> pk.TaskPacket:
    inputs = draw(st.lists(any_ids, max_size=3))
    outputs = draw(st.lists(any_ids, max_size=3, unique_by=str) | st.lists(any_ids, max_size=3))
    pulled = {draw(st.sampled_from(inputs) if inputs and draw(st.booleans()) else any_ids): draw(any_ids)
              for _ in range(draw(st.integers(0, 2)))}
    attrs = draw(attrs_maps)
    wrap = draw(st.sampled_from([tuple, list]))
    return pk.TaskPacket(
        draw(mostly("j1.t2.a0", "j1.t2.a01", "j1.t2", 5)), draw(any_ids), wrap(inputs),
        wrap(outputs), draw(numbers),
        draw(st.sampled_from([dict, MappingProxyType]))(pulled),  # type: ignore[operator]
        draw(st.sampled_from([dict, MappingProxyType]))(attrs),  # type: ignore[operator]
        draw(any_ids), draw(numbers))


@st.composite
def near_replies(draw: st.DrawFn) -> pk.Reply:
    outs = tuple(pk.TileInfo(draw(any_ids), tuple(draw(st.lists(mostly(3, 0, -1, 2**64, 1.0),
                                                                   max_size=2))),
                             draw(mostly("float32", "Float32", 3)), draw(mostly(4, -4, 2**64, 4.0)))
                 for _ in range(draw(st.integers(0, 2))))
    timings = pk.Timings(draw(numbers), draw(numbers), draw(numbers))
    error = draw(mostly(None, pk.TaskError("user", "boom")))
    return pk.Reply(draw(mostly("j1.t2.a0", "j1.t2")), draw(mostly(True, False, 1)),
                    timings, outs, error)


def general_task(p: pk.TaskPacket) -> bytes:
    wire = schema.task_to_wire(p)
    schema.task_from_wire(wire)
    return codec._task_body(wire)


def general_reply(r: pk.Reply) -> bytes:
    wire = schema.reply_to_wire(r)
    schema.reply_from_wire(wire)
    return pk.canonical(wire)


def test_common_messages_take_the_fast_path_with_the_general_bytes() -> None:
    body = codec._task_body_checked(GOOD_TASK)
    assert body is not None and body == general_task(GOOD_TASK)
    body = codec._reply_body_checked(GOOD_REPLY)
    assert body is not None and body == general_reply(GOOD_REPLY)
    assert pk.decode_task(pk.encode_task(GOOD_TASK, SECRET), SECRET, now=GOOD_TASK.t) == GOOD_TASK
    assert pk.decode_reply(pk.encode_reply(GOOD_REPLY, SECRET), SECRET) == GOOD_REPLY


@pytest.mark.parametrize("change", [{"task": "j1.t2"}, {"inputs": ("bad id",)}, {"outputs": ("a", "a")},
                                    {"pull_from": {"elsewhere": "n1"}}, {"deadline": math.nan},
                                    {"attrs": {"x": math.inf}}, {"attrs": {"x": 2**63}},
                                    {"attrs": {"k" * 129: 1}}, {"to": ""}, {"to": "a b"}, {"t": math.inf}])
def test_invalid_tasks_are_left_to_the_explaining_path(change: dict[str, Any]) -> None:
    bad = GOOD_TASK._replace(**change)
    assert codec._task_body_checked(bad) is None
    with pytest.raises(pk.PacketInvalid):
        pk.encode_task(bad, SECRET)


@settings(max_examples=500)  # cheap; the rare near-misses need the numbers
@given(near_tasks())
def test_fast_task_writer_accepts_only_what_decodes(p: pk.TaskPacket) -> None:
    try:
        body = codec._task_body_checked(p)
    except pk.PacketInvalid:  # canonical() refusing a lone surrogate, as on the general path
        with pytest.raises(pk.PacketInvalid):
            general_task(p)
        return
    if body is None:
        return
    assert body == general_task(p)
    schema.task_from_wire(json.loads(body))


@settings(max_examples=500)
@given(near_replies())
def test_fast_reply_writer_accepts_only_what_decodes(r: pk.Reply) -> None:
    body = codec._reply_body_checked(r)
    if body is None:
        return
    assert body == general_reply(r)
    schema.reply_from_wire(json.loads(body))


@settings(max_examples=300)
@given(attrs_maps, st.sampled_from([dict, MappingProxyType]))
def test_known_attrs_text_gives_the_same_packet(attrs: dict[str, Any], kind: Any) -> None:
    """A sender's ``attrs_text`` (computed once, passed to every packet with those attrs)
    writes the bytes ``encode_task`` writes without it, and refuses what it refuses."""
    p = GOOD_TASK._replace(attrs=kind(attrs))
    try:
        plain = pk.encode_task(p, SECRET)
    except pk.PacketInvalid:
        with pytest.raises(pk.PacketInvalid):
            pk.attrs_text(p.attrs)
        return
    text = pk.attrs_text(p.attrs)
    assert pk.encode_task(p, SECRET, known_attrs=text) == plain
    assert pk.decode_task(plain, SECRET, now=p.t).attrs == json.loads(text)
