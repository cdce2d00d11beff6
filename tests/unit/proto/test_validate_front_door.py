"""The one rank limit (``triplane.proto.limits.MAX_RANK``) wherever a shape is made, and the
id rules of ``triplane.proto.validate`` (what a client may name a node or fetch)."""

from __future__ import annotations

import pytest

import triplane as tp
from triplane.proto.errors import GraphError, LimitError
from triplane.proto.ir import Graph
from triplane.proto.limits import MAX_ID_LENGTH, MAX_RANK
from triplane.proto.packet import PacketError
from triplane.proto.validate import check_id, check_submission, loads_json, validate


def _reshaped(rank: int) -> Graph:
    shape = [1] * (rank - 1) + [4]
    return Graph.from_dict({"version": 1, "nodes": {
        "x": {"op": "full", "shape": [4], "dtype": "float32",
              "attrs": {"shape": [4], "dtype": "float32", "value": 1.0}},
        "y": {"op": "reshape", "inputs": ["x"], "shape": shape, "dtype": "float32",
              "attrs": {"shape": shape}}}, "outputs": ["y"]})


def test_validate_refuses_more_than_max_rank_naming_the_node() -> None:
    validate(_reshaped(MAX_RANK))
    with pytest.raises(LimitError, match=f"limit of {MAX_RANK}") as e:
        validate(_reshaped(MAX_RANK + 1))
    assert e.value.node == "y" and e.value.op == "reshape"


def test_the_sdk_refuses_more_than_max_rank_at_the_line_that_writes_it() -> None:
    x = tp.ones(4)
    assert x.reshape((1,) * (MAX_RANK - 1) + (4,)).shape == (1,) * (MAX_RANK - 1) + (4,)
    with pytest.raises(LimitError, match=f"limit of {MAX_RANK}"):
        x.reshape((1,) * MAX_RANK + (4,))


def test_codecs_share_the_limit() -> None:
    from triplane.metadb.validate import MAX_TILE_RANK
    from triplane.proto.dataport import MAX_NDIM
    from triplane.scheduler.store import MAX_NDIM as STORE_NDIM

    assert MAX_NDIM == STORE_NDIM == MAX_TILE_RANK == MAX_RANK


def test_a_packet_reply_with_more_than_max_rank_is_refused() -> None:
    from triplane.proto.packet.schema import _tile_from_wire

    ok = {"tile": "j1.t0", "shape": [1] * MAX_RANK, "dtype": "float32", "bytes": 4}
    assert _tile_from_wire(ok, 0).shape == tuple([1] * MAX_RANK)
    with pytest.raises(PacketError, match="dimensions"):
        _tile_from_wire({**ok, "shape": [1] * (MAX_RANK + 1)}, 0)


@pytest.mark.parametrize("good", ["y", "n17", "loss (train)", "é", "a.b", "a-b_c", "x" * MAX_ID_LENGTH])
def test_check_id_accepts_fetchable_names(good: str) -> None:
    assert check_id(good) == good


@pytest.mark.parametrize("bad", ["", "/", "a/b", ".", "..", "a\x00", "\x1b", "\x85", "\ud800", "x" * 129, 3])
def test_check_id_refuses_what_cannot_be_fetched(bad: object) -> None:
    with pytest.raises(GraphError) as e:
        check_id(bad, "fetch[0]")
    assert str(e.value).startswith("fetch[0]")
    str(e.value).encode("utf-8")  # the message itself is always writable


def test_check_submission_names_the_node_and_the_field() -> None:
    with pytest.raises(GraphError, match=r"outputs\[0\]"):
        check_submission({"nodes": {}, "outputs": ["a/b"]}, [])
    with pytest.raises(LimitError) as e:
        check_submission({"nodes": {"z": {"op": "full", "shape": [1] * 40}}}, [])
    assert e.value.node == "z" and e.value.op == "full"
    check_submission("not a graph", None)  # left to Graph.from_dict


def test_loads_json_refuses_duplicate_keys_at_any_depth() -> None:
    assert loads_json(b'{"a": {"b": 1}}') == {"a": {"b": 1}}
    for doc in (b'{"a": 1, "a": 1}', b'{"a": {"b": 1, "b": 2}}', b'[{"x": 0, "x": 0}]'):
        with pytest.raises(GraphError, match="duplicate key"):
            loads_json(doc)
    with pytest.raises(GraphError, match="Infinity"):
        loads_json(b'{"a": Infinity}')


@pytest.mark.parametrize("doc", [
    b'{"a":1,"a":2}', b'{"n":{"x":{"b":1,"c":2,"b":3}}}', b'{"a" :1,"a":2}', b'{"a":1,"a"\n:2}',
    b'[{"k":1},{"k":2,"k":3}]', b'{"s":"x\\":1","s":2}', b'{"a":"\\u0022","a":1}',
])
def test_loads_json_refuses_duplicate_keys_in_compact_bodies(doc: bytes) -> None:
    # compact bodies (as clients send them) take the C parser's path: the same refusals
    with pytest.raises(GraphError, match="duplicate key"):
        loads_json(doc)


def test_loads_json_reads_what_the_stdlib_reads() -> None:
    import json

    nodes = {f"n{i}": {"op": "full", "shape": [], "attrs": {"value": i / 7, "shape": []}} for i in range(300)}
    for body in (json.dumps({"graph": {"nodes": nodes}, "fetch": ["n1"]}, separators=(",", ":")).encode(),
                 b'{"x":123456789012345678901234567890,"y":-9223372036854775808}',
                 b'{"a":"\\udfff","b":1e400,"c":[1,{"d":null}],"e":"\\u00e9"}', '{"é":"ü"}'.encode()):
        assert loads_json(body) == json.loads(body)
    assert type(loads_json(b'{"x":123456789012345678901234567890}')["x"]) is int
    with pytest.raises(GraphError, match="NaN"):
        loads_json(b'{"a":NaN}')
