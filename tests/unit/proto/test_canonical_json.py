"""Canonical JSON: the golden vectors under proto/vectors/ (shared with the Go and JS
SDKs) and properties of the number and key formatting."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triplane.proto.builder import Builder
from triplane.proto.canonjson import canonical_json, es_number
from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph

VECTORS = Path(__file__).resolve().parents[3] / "proto" / "vectors"


# --- the golden graphs, built in code (the files must hold exactly these bytes) -------


def _mlp() -> Graph:
    b = Builder(prefix="n")
    x = b.op("input", tensor="t-9f2c", shape=(4, 3), dtype="float32")
    w = b.op("input", tensor="t-w", shape=(3, 2), dtype="float32")
    bias = b.op("full", value=0.1, shape=(2,), dtype="float32")
    y = b.op("add", b.op("matmul", x, w), bias)
    loss = b.op("sum", b.op("exp", y), axes=[-1], keepdims=False)
    return b.graph([loss])


def _numbers() -> Graph:
    b = Builder(prefix="c")
    x = b.op("input", tensor="t", shape=(2, 2), dtype="float64")
    s = 0
    for v in (1e21, 1e-7, 1e-6, 0.30000000000000004, 5e-324, -1.7976931348623157e308, 2.0**53, -3):
        s = b.op("mul", x if s == 0 else s, b.op("full", value=v, shape=(), dtype="float64"))
    return b.graph([s])


def _unicode() -> Graph:
    # Keys that sort differently by UTF-16 code unit (RFC 8785) and by code point:
    # U+1F600 is the surrogate pair D83D DE00, which sorts before U+E000.
    nodes = {
        "\U0001f600": ("input", {"tensor": "données/é\u00e9\"\\\n\t\u0001\u007f", "shape": (3,)}),
        "\ue000": ("input", {"tensor": "τ-\u2028", "shape": (3,)}),
        "a": ("input", {"tensor": "", "shape": (3,)}),
    }
    b = Builder()
    refs = {k: b.add_node(op, [], {**a, "dtype": "float16"}, node_id=k) for k, (op, a) in nodes.items()}
    s = b.add_node("add", [refs["\U0001f600"], refs["\ue000"]], {}, node_id="Z")
    out = b.add_node("sub", [s, refs["a"]], {}, node_id="z")
    return b.graph([out])


def _shapes() -> Graph:
    b = Builder(prefix="s")
    x = b.op("input", tensor="x", shape=(2, 3, 4), dtype="int32")
    t = b.op("transpose", x, perm=[2, 0, 1])
    r = b.op("reshape", t, shape=(4, 6))
    c = b.op("cast", b.op("broadcast_to", r, shape=(5, 4, 6)), dtype="bfloat16")
    e = b.op("full", value=True, shape=(0,), dtype="bool")
    return b.graph([c, e])


GOLDEN: dict[str, Callable[[], Graph]] = {
    "mlp": _mlp, "numbers": _numbers, "unicode": _unicode, "shapes": _shapes,
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_graph_bytes(name: str) -> None:
    want = (VECTORS / "graphs" / f"{name}.json").read_bytes()
    want_hash = (VECTORS / "graphs" / f"{name}.sha256").read_text().split()[0]
    g = GOLDEN[name]()
    assert g.to_json() == want, f"{name}: canonical bytes differ from the golden file"
    assert g.hash() == want_hash == hashlib.sha256(want).hexdigest()
    # the golden file parses back to the same graph and the same bytes
    back = Graph.from_json(want)
    assert back == g
    assert back.to_json() == want
    assert back.structure_hash() == g.structure_hash()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_graphs_have_no_insignificant_whitespace(name: str) -> None:
    raw = (VECTORS / "graphs" / f"{name}.json").read_bytes()
    # Re-serialising with Python's own compact sorted JSON agrees except for the number
    # and key-order rules, so whitespace can only come from inside strings.
    assert not raw.endswith(b"\n")
    assert b": " not in raw and b", " not in raw


def _number_cases() -> list[dict[str, str]]:
    return json.loads((VECTORS / "numbers.json").read_text())["cases"]


def test_number_vectors_match_byte_for_byte() -> None:
    cases = _number_cases()
    assert len(cases) >= 20
    for case in cases:
        x = struct.unpack(">d", bytes.fromhex(case["bits"]))[0]
        assert es_number(x) == case["canonical"], case
        assert canonical_json([x]) == f"[{case['canonical']}]".encode(), case
        # the canonical text reads back as the same double (-0 aside)
        assert float(case["canonical"]) == x


@pytest.mark.parametrize(("x", "text"), [
    (1e21, "1e+21"), (1e20, "100000000000000000000"), (1e-7, "1e-7"), (1e-6, "0.000001"),
    (0.1, "0.1"), (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
    (-0.0, "0"), (123456789012345680000.0, "123456789012345680000"), (2.0**53, "9007199254740992"),
    (0.30000000000000004, "0.30000000000000004"), (-1.5e-9, "-1.5e-9"), (1.0, "1"), (-2.0, "-2"),
    (123.456, "123.456"), (1.2345e-5, "0.000012345"), (2.5e25, "2.5e+25"),
])
def test_es_number_examples(x: float, text: str) -> None:
    assert es_number(x) == text


@pytest.mark.parametrize("x", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused(x: float) -> None:
    with pytest.raises(GraphError, match="not representable"):
        canonical_json({"v": x})


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_es_number_round_trips_and_is_shortest(x: float) -> None:
    s = es_number(x)
    assert float(s) == x
    # as short as Python's repr (both are shortest round-trip), allowing for the
    # exponent spelling ("1e-07" vs "1e-7") and the plain-notation range of ECMAScript
    digits = s.lstrip("-").split("e")[0].replace(".", "").strip("0")
    rdigits = repr(abs(x)).split("e")[0].replace(".", "").strip("0")
    assert digits == rdigits or x == 0


def test_keys_sort_by_utf16_code_units() -> None:
    got = canonical_json({"\ue000": 1, "\U0001f600": 2, "a": 3, "B": 4, "": 5})
    assert got == '{"":5,"B":4,"a":3,"\U0001f600":2,"\ue000":1}'.encode()


def test_string_escapes_follow_json_stringify() -> None:
    got = canonical_json(["\"\\/\b\f\n\r\t\u0000\u001f\u007f\u2028é"])
    assert got == '["\\"\\\\/\\b\\f\\n\\r\\t\\u0000\\u001f\u007f\u2028é"]'.encode()


def test_lone_surrogate_is_a_graph_error() -> None:
    with pytest.raises(GraphError, match="surrogate"):
        canonical_json(["\ud800"])


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


@given(_json_values)
def test_fast_encoder_writes_what_the_reference_encoder_writes(value: object) -> None:
    from triplane.proto.canonjson import _emit

    out: list[str] = []
    _emit(value, out)
    assert canonical_json(value) == "".join(out).encode("utf-8")
