"""The task packet codec (triplane.proto.packet) against proto/packet.md and its golden files."""

from __future__ import annotations

import asyncio
import base64
import datetime
import hmac
import json
import math
import random
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triplane.proto import packet as pk
from triplane.proto.packet import codec, schema
from triplane.proto.packet.schema import task_from_wire, task_to_wire

SECRET = b"triplane-test-secret-NOT-FOR-PRODUCTION"
NOW = 1732212340.0
VECTORS = Path(__file__).resolve().parents[3] / "proto" / "vectors" / "packets"

# --- strategies ---------------------------------------------------------------------------

ID_CHARS = string.ascii_letters + string.digits + "_.:/@+=,~-"
ids = st.text(ID_CHARS, min_size=1, max_size=24)
part = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=8)
task_ids = st.builds(lambda j, t, a: f"{j}.{t}.a{a}", part, part, st.integers(0, 999))
# Any Unicode scalar value (no lone surrogates, which UTF-8 cannot carry).
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
floats = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | floats | texts
attr_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12)
attrs = st.dictionaries(texts, attr_values, max_size=5)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@st.composite
def task_packets(draw: st.DrawFn) -> pk.TaskPacket:
    inputs = tuple(draw(st.lists(ids, max_size=4)))
    pulled = draw(st.lists(st.sampled_from(inputs), unique=True)) if inputs else []
    return pk.TaskPacket(
        task=draw(task_ids), op=draw(ids), inputs=inputs,
        outputs=tuple(draw(st.lists(ids, max_size=3, unique=True))), deadline=draw(times),
        pull_from={t: draw(ids) for t in pulled}, attrs=draw(attrs), to=draw(ids), t=draw(times))


@st.composite
def replies(draw: st.DrawFn) -> pk.Reply:
    timings = pk.Timings(draw(times), draw(times), draw(times))
    if draw(st.booleans()):
        outs = draw(st.lists(st.builds(pk.TileInfo, ids, st.lists(st.integers(0, 2**40), max_size=4)
                                       .map(tuple), st.sampled_from(["float32", "bfloat16", "int64"]),
                                       st.integers(0, 2**40)), max_size=3))
        return pk.Reply(draw(task_ids), True, timings, tuple(outs))
    err = pk.TaskError(draw(st.sampled_from(["user", "infra"])), draw(texts),
                       draw(st.none() | ids), draw(st.none() | ids))
    return pk.Reply(draw(task_ids), False, timings, (), err)


controls = st.builds(lambda k, i, t: pk.Control(k, i, t), st.sampled_from(["ping", "pong"]), ids,
                     times) | st.builds(lambda t, s, since: pk.Control("ack", t, s, since), task_ids,
                                        times, st.none() | times)
messages = task_packets() | replies() | controls


def typed(x: Any) -> Any:
    """``x`` with every scalar tagged by its type, so that 1 == 1.0 == True cannot hide a
    changed type in a comparison."""
    if isinstance(x, dict):
        return {k: typed(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [typed(v) for v in x]
    return (type(x).__name__, x)


def wire_of(m: Any) -> dict[str, Any]:
    """The signed fields of ``m`` as a plain JSON-like dict (the packet minus sig)."""
    to_wire = {pk.TaskPacket: schema.task_to_wire, pk.Reply: schema.reply_to_wire,
               pk.Control: schema.control_to_wire}[type(m)]
    return json.loads(json.dumps(to_wire(m)))


def decode_any(data: bytes, **kw: Any) -> Any:
    kw.setdefault("now", NOW)
    kw.setdefault("max_bytes", pk.MAX_FRAME_BYTES)
    return pk.decode(data, SECRET, max_ahead=1e10, grace=1e10, max_age=1e10, **kw)


# --- round trips --------------------------------------------------------------------------


@given(messages)
def test_yaml_json_and_codec_read_the_same_message(m: Any) -> None:
    data = pk.encode(m, SECRET)
    by_yaml, by_json = yaml.safe_load(data), json.loads(data)
    assert typed(by_yaml) == typed(by_json)
    sig = by_yaml.pop("sig")
    assert typed(by_yaml) == typed(wire_of(m))
    assert sig == hmac.new(SECRET, pk.canonical(by_yaml), "sha256").hexdigest()
    assert decode_any(data) == m


@given(task_packets())
def test_task_fast_writer_matches_canonical(p: pk.TaskPacket) -> None:
    wire = schema.task_to_wire(p)
    assert codec._task_body(wire) == pk.canonical(wire)


@given(messages, st.booleans())
def test_other_spellings_are_refused_before_they_are_parsed(m: Any, flow: bool) -> None:
    # The signature covers the exact bytes and is checked first: YAML in another style (or
    # re-indented JSON) has no trailing sig member, so it is refused without being read.
    signed = yaml.safe_load(pk.encode(m, SECRET))
    text = yaml.safe_dump(signed, default_flow_style=flow, width=70)
    with pytest.raises(pk.PacketSignatureError) as err:
        decode_any(text.encode("utf-8"))
    assert err.value.reason == "unsigned"


def test_nothing_unauthenticated_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(data: bytes) -> Any:
        raise AssertionError("parsed before the signature was checked")

    monkeypatch.setattr(codec, "_parse", never)
    data = pk.encode(GOOD, SECRET)
    for bad, reason in [(b"x" * 60000, "unsigned"), (b"v: 2\nsig: " + b"0" * 64, "unsigned"),
                        (data[:-3] + b'0"}', "bad_signature"), (data.replace(b'"to":"n1"', b'"to":"n2"'),
                                                              "bad_signature")]:
        reject(bad, reason, max_bytes=pk.MAX_FRAME_BYTES)


def test_pitfall_values_keep_their_types_through_yaml() -> None:
    attrs = {"f": [1e16, 1e-05, 5e-324, 1.7976931348623157e308, -0.0, 123.0, -1e100],
             "s": ["yes", "on", "y", "null", "~", "1e5", "0x1F", "012", "2001-12-14", "1:30", ".nan"],
             "c": ["\x00\x07\x7f\x85\u2028\u2029\ufeff\ufffe\uffff", "\\/", '"', "\U0001f600"],
             "n": [0, -1, 2**63 - 1, -(2**63)], "b": [True, False, None]}
    p = pk.TaskPacket("j1.t1.a0", "noop", (), (), 1e9 + 0.5, {}, attrs, "n1", 1e9)
    data = pk.encode(p, SECRET)
    assert data.count(b"\n") == 0 and b"e+16" in data and b"1.0e+16" in data
    assert typed(yaml.safe_load(data)["attrs"]) == typed(attrs)
    assert typed(decode_any(data).attrs) == typed(attrs)


def test_canonical_form_is_sorted_compact_and_signed_last() -> None:
    p = pk.TaskPacket("j42.t17.a0", "matmul", ("j42.x.0.1", "j42.w.1.0"), ("j42.t17",), 1732212345.12,
                      {"j42.w.1.0": "n2"}, {}, "n1", 1732212340.25)
    data = pk.encode(p, SECRET)
    body = (b'{"attrs":{},"deadline":1732212345.12,"from":{"j42.w.1.0":"n2"},'
            b'"in":["j42.x.0.1","j42.w.1.0"],"op":"matmul","out":["j42.t17"],"t":1732212340.25,'
            b'"task":"j42.t17.a0","to":"n1","v":2}')
    assert data == body[:-1] + b',"sig":"' + hmac.new(SECRET, body, "sha256").hexdigest().encode() + b'"}'
    assert len(data) <= pk.MAX_DATAGRAM_BYTES


# --- golden files -------------------------------------------------------------------------

CASES = json.loads((VECTORS / "cases.json").read_text())


def test_golden_index_uses_the_test_secret() -> None:
    assert CASES["secret"].encode() == SECRET and "TEST ONLY" in CASES["secret_note"]
    assert {c["expect"] for c in CASES["cases"]} >= {"ok", "bad_signature", "unsigned", "version",
                                                      "malformed", "invalid", "oversized"}


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["name"] for c in CASES["cases"]])
def test_golden_packet(case: dict[str, Any]) -> None:
    data = (VECTORS / case["file"]).read_bytes()
    decoders = {"task": pk.decode_task, "reply": pk.decode_reply, "control": pk.decode_control}
    kw: dict[str, Any] = {"now": CASES["now"]} if case["kind"] != "reply" else {}
    if case["expect"] != "ok":
        with pytest.raises(pk.PacketError) as err:
            decoders[case["kind"]](data, CASES["secret"].encode(), **kw)
        assert err.value.reason == case["expect"]
        return
    m = decoders[case["kind"]](data, CASES["secret"].encode(), **kw)
    assert wire_of(m) == case["message"]
    # Byte for byte, and independently of the codec: YAML reads it, the HMAC is over the rest.
    assert pk.encode(m, SECRET) == data
    signed = yaml.safe_load(data)
    sig = signed.pop("sig")
    assert typed(signed) == typed(case["message"])
    assert data == pk.canonical(signed)[:-1] + b',"sig":"' + sig.encode() + b'"}'
    assert sig == hmac.new(SECRET, pk.canonical(signed), "sha256").hexdigest()


def test_golden_task_matmul_is_documented_in_packet_md() -> None:
    doc = (VECTORS.parents[1] / "packet.md").read_text()
    assert (VECTORS / "task_matmul.packet").read_text() in doc


# --- rejections ---------------------------------------------------------------------------

GOOD = pk.TaskPacket("j42.t17.a0", "matmul", ("j42.x.0.1", "j42.w.1.0"), ("j42.t17",), NOW + 5,
                     {"j42.w.1.0": "n2"}, {"alpha": 1.5}, "n1", NOW)


def sign_text(body: bytes) -> bytes:
    """Any ``body`` ending in ``}`` with a valid trailing sig member: what follows the
    signature check (syntax, schema) is then what decides."""
    return body[:-1] + b',"sig":"' + pk.sign(body, SECRET).encode() + b'"}'


def resign(wire: dict[str, Any]) -> bytes:
    """``wire`` signed properly: rejections then come from the schema, not the signature."""
    return sign_text(pk.canonical(wire))


def reject(data: bytes, reason: str, **kw: Any) -> pk.PacketError:
    kw.setdefault("now", NOW)
    with pytest.raises(pk.PacketError) as err:
        pk.decode_task(data, SECRET, **kw)
    assert err.value.reason == reason, err.value
    return err.value


@pytest.mark.parametrize(("change", "field"), [
    ({"task": "j42.t17"}, "task"), ({"task": "j42.t17.a01"}, "task"), ({"op": ""}, "op"),
    ({"op": 7}, "op"), ({"in": "j42.x"}, "in"), ({"in": ["ok", "bad id"]}, "in[1]"),
    ({"out": ["a", "a"]}, "out"), ({"from": {"j42.zz": "n2"}}, "from.j42.zz"),
    ({"from": {"j42.w.1.0": None}}, "from.j42.w.1.0"), ({"attrs": []}, "attrs"),
    ({"attrs": {"k": {"deep": [1, datetime.date(2001, 12, 14)]}}}, "attrs.k.deep[1]"),
    ({"deadline": "soon"}, "deadline"),
    ({"deadline": True}, "deadline"), ({"v": "1"}, "v"), ({"extra": 1}, ""), ({"x" * 200: 1}, ""),
    ({"to": "a b"}, "to"), ({"to": None}, "to"), ({"t": "now"}, "t"),
])
def test_invalid_fields_are_named(change: dict[str, Any], field: str) -> None:
    wire = {**schema.task_to_wire(GOOD), **change}
    if "attrs" in change:  # not JSON-encodable: flow YAML (a date), signed as written
        data = sign_text(yaml.safe_dump(wire, default_flow_style=True, width=10**6).strip().encode())
    else:
        data = resign(wire)
    err = reject(data, "invalid")
    assert isinstance(err, pk.PacketInvalid) and err.field == field


def test_missing_field_is_named() -> None:
    wire = schema.task_to_wire(GOOD)
    del wire["deadline"]
    assert "missing ['deadline']" in str(reject(resign(wire), "invalid"))


def test_signature_rejections() -> None:
    data = pk.encode(GOOD, SECRET)
    assert pk.decode_task(data, SECRET, now=NOW) == GOOD
    reject(data[:-74] + b"}", "unsigned")
    reject(data.replace(b'"alpha":1.5', b'"alpha":2.5'), "bad_signature")
    reject(data.replace(data[-66:-2], data[-66:-2].upper()), "bad_signature")
    with pytest.raises(pk.PacketSignatureError):
        pk.decode_task(data, b"x" * 32, now=NOW)
    # Same meaning, other spelling: the signature covers the bytes, so it is refused.
    reject(json.dumps(json.loads(data), indent=2).encode(), "unsigned", max_bytes=pk.MAX_FRAME_BYTES)
    reject(data.replace(b'"to":"n1"', b'"to":"n2"'), "bad_signature")  # the destination is signed


def test_injected_keys_are_refused() -> None:
    data = pk.encode(GOOD, SECRET)
    reject(data.replace(b'{"attrs"', b'{"op":"evil","attrs"'), "bad_signature")
    block = yaml.safe_dump(json.loads(data)).encode()
    reject(block + b"op: evil\n", "unsigned")
    reject(data[:-1] + b',"op":"evil"}', "unsigned")  # after the sig member: not the trailer


def test_version_and_staleness() -> None:
    reject(resign({**schema.task_to_wire(GOOD), "v": 1}), "version")
    data = pk.encode(GOOD, SECRET)
    assert pk.decode_task(data, SECRET, now=GOOD.deadline + 9.0, grace=10.0) == GOOD
    reject(data, "stale", now=GOOD.deadline + 11.0, grace=10.0)
    reject(data, "stale", now=GOOD.deadline - 100.0, max_ahead=50.0)
    late = pk.encode(GOOD._replace(deadline=NOW + 3600), SECRET)  # sent at NOW
    assert pk.decode_task(late, SECRET, now=NOW + 29) == GOOD._replace(deadline=NOW + 3600)
    reject(late, "stale", now=NOW + 31)  # whatever its deadline: sent too long ago
    reject(late, "stale", now=NOW - 31)
    ping = pk.encode(pk.Control("ping", "n1", NOW), SECRET)
    assert pk.decode_control(ping, SECRET, now=NOW + 29) == pk.Control("ping", "n1", NOW)
    with pytest.raises(pk.PacketStale):
        pk.decode_control(ping, SECRET, now=NOW + 31)
    with pytest.raises(pk.PacketStale):
        pk.decode(ping, SECRET, now=NOW - 31)


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "malformed"), (b"\xff\xfe\x00", "unsigned"), (b"[1, 2]", "unsigned"),
    (b"{" + b" " * 2000 + b"}", "oversized"), (b"[" * 60000 + b"]" * 60000, "oversized"),
    (b"- " * 30000, "oversized"), (b"{not: [closed", "unsigned"), (b"v: 1\nx: !!python/name:os.system\n",
                                                                   "unsigned"),
    (b"a: &x [1]\nb: *x\n", "unsigned"), (b"d: 2001-13-45\n", "unsigned"),
    (b"v: 1\n<<: {task: x}\n", "unsigned"), (b"--- 1\n--- 2\n", "unsigned"),
])
def test_bad_bytes_raise_only_packet_errors(data: bytes, reason: str) -> None:
    reject(data, reason)


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not: [closed}", "malformed"), (b"{v: 2, x: !!python/name:os.system }", "malformed"),
    (b"{a: &x [1], b: *x}", "malformed"), (b"{d: 2001-13-45}", "malformed"),
    (b"{v: 2, <<: {task: x}}", "malformed"),
])
def test_signed_bad_yaml_is_still_refused_by_the_safe_loader(body: bytes, reason: str) -> None:
    reject(sign_text(body), reason)


def test_deep_nesting_never_reaches_the_recursive_yaml_composer() -> None:
    # libyaml's composer recursion segfaults near 30,000 levels: the codec must refuse first
    # (unsigned text is not even parsed; a signed one meets the depth guard).
    for data in (b"[" * 30000 + b"]" * 30000, b"- " * 30000 + b"1", b"{a: " * 12000 + b"1" + b"}" * 12000):
        reject(data, "unsigned", max_bytes=pk.MAX_FRAME_BYTES)
    reject(sign_text(b"{a: " * 12000 + b"1" + b"}" * 12000), "malformed", max_bytes=pk.MAX_FRAME_BYTES)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    with pytest.raises(pk.PacketError):
        decode_any(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(messages, st.randoms(use_true_random=False), st.integers(1, 4))
def test_fuzz_mutated_packets(m: Any, rnd: random.Random, n: int) -> None:
    data = bytearray(pk.encode(m, SECRET))
    for _ in range(n):
        i = rnd.randrange(len(data))
        op = rnd.randrange(3)
        if op == 0:
            data[i] = rnd.randrange(256)
        elif op == 1:
            del data[i]
        else:
            data.insert(i, rnd.choice(b'{}[]",:\\ \n-!&*#e.0a\xc3\xff'))
    try:
        got = decode_any(bytes(data))
    except pk.PacketError:
        return
    assert got == m  # a mutation that survives must not have changed what was signed


def test_encode_refuses_what_decode_would_refuse() -> None:
    for bad in (GOOD._replace(task="nope"), GOOD._replace(to=""), GOOD._replace(to="a b"),
                GOOD._replace(attrs={"x": math.nan}),
                GOOD._replace(attrs={"x": "\ud800"}), GOOD._replace(attrs={"x": object()}),
                GOOD._replace(attrs={"x": 2**64}), GOOD._replace(outputs=("a", "a"))):
        with pytest.raises(pk.PacketInvalid):
            pk.encode(bad, SECRET)
    with pytest.raises(pk.PacketTooLarge):
        pk.encode(GOOD._replace(attrs={"blob": "x" * 70000}), SECRET)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        pk.encode(GOOD, b"short")


def test_datagram_and_frame_bounds() -> None:
    big = pk.encode(GOOD._replace(attrs={"blob": "x" * 3000}), SECRET)
    assert pk.MAX_DATAGRAM_BYTES < len(big) <= pk.MAX_FRAME_BYTES
    reject(big, "oversized")
    assert pk.decode_task(big, SECRET, now=NOW, max_bytes=pk.MAX_FRAME_BYTES).attrs["blob"] == "x" * 3000


def test_parse_task_id() -> None:
    assert pk.parse_task_id("j42.t17.a3") == ("j42", "t17", 3)
    for bad in ("j42.t17", "j42.t17.a", "j42.t17.a-1", "j.t.a1.x", "j 4.t.a0"):
        with pytest.raises(pk.PacketInvalid):
            pk.parse_task_id(bad)


# --- framing, counters, replay memory -----------------------------------------------------


@given(st.lists(st.binary(min_size=1, max_size=200), max_size=6), st.integers(1, 50))
def test_frame_buffer_reassembles_any_chunking(payloads: list[bytes], step: int) -> None:
    stream = b"".join(pk.frame(p) for p in payloads)
    buf, got = pk.FrameBuffer(), []
    for i in range(0, len(stream), step):
        got += buf.feed(stream[i:i + step])
    assert got == payloads and buf.pending == 0


def test_frame_buffer_refuses_bad_headers_before_buffering() -> None:
    with pytest.raises(pk.PacketTooLarge):
        pk.FrameBuffer().feed((pk.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(pk.PacketMalformed):
        pk.FrameBuffer().feed(b"\x00\x00\x00\x00")
    with pytest.raises(pk.PacketTooLarge):
        pk.frame(b"x" * (pk.MAX_FRAME_BYTES + 1))


def test_read_frame_from_a_stream() -> None:
    async def run(data: bytes) -> list[bytes | None]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        out: list[bytes | None] = []
        while (f := await asyncio.wait_for(pk.read_frame(reader), 5)) is not None:
            out.append(f)
        return out

    assert asyncio.run(run(pk.frame(b"ab") + pk.frame(b"c"))) == [b"ab", b"c"]
    for bad, err in ((pk.frame(b"abc")[:-1], pk.PacketMalformed), (b"\x00\x01", pk.PacketMalformed),
                     (b"\x00\x02\x00\x01", pk.PacketTooLarge)):
        with pytest.raises(err):
            asyncio.run(run(bad))


def test_drop_counters_count_every_reason() -> None:
    counters = pk.DropCounters()
    reasons = {"oversized", "malformed", "invalid", "version", "unsigned", "bad_signature", "stale"}
    for cls in (pk.PacketTooLarge, pk.PacketMalformed, pk.PacketInvalid, pk.PacketVersionError,
                pk.PacketStale):
        counters.count(cls("x"))
    for r in ("unsigned", "bad_signature"):
        counters.count(pk.PacketSignatureError("x", reason=r))  # type: ignore[arg-type]
    assert counters.as_dict() == {**dict.fromkeys(reasons, 1), "duplicate": 0, "misaddressed": 0}
    assert counters.total == 7


def test_replay_guard_drops_replays_until_expiry_and_stays_bounded() -> None:
    g = pk.ReplayGuard(capacity=3)
    assert g.admit("j.t.a0", expires_at=100, now=0)
    assert not g.admit("j.t.a0", expires_at=100, now=1)
    assert g.admit("j.t.a1", expires_at=100, now=1)  # the next attempt is a new task
    g.remember_reply("j.t.a0", b"reply")
    assert g.reply_for("j.t.a0") == b"reply" and g.reply_for("j.t.a1") is None
    assert g.admit("j.u.a0", 5, now=2) and g.admit("j.v.a0", 200, now=2)  # evicts j.t.a0 (live)
    assert g.evicted_live == 1 and len(g) == 3 and "j.t.a0" not in g
    assert g.admit("j.w.a0", 300, now=150)  # expired entries go first, not counted as live
    assert g.evicted_live == 1 and "j.u.a0" not in g and len(g) <= 3


def test_public_api_is_pinned() -> None:
    assert set(pk.__all__) == {
        "CARRY_MAX_BYTES", "Carried", "DEFAULT_GRACE", "DEFAULT_MAX_AGE", "DEFAULT_MAX_AHEAD",
        "MAX_DATAGRAM_BYTES", "MAX_FRAME_BYTES", "REPLY_CARRY_MAX_BYTES",
        "VERSION", "Control", "DropCounters", "FrameBuffer", "Message", "PacketError", "PacketInvalid",
        "PacketMalformed", "PacketSignatureError", "PacketStale", "PacketTooLarge", "PacketVersionError",
        "ReplayGuard", "Reply", "TaskError", "TaskPacket", "TileInfo", "Timings", "attrs_text", "canonical",
        "decode", "decode_control", "decode_reply", "decode_task", "encode", "encode_control", "encode_reply",
        "encode_task", "frame", "parse_task_id", "read_frame", "sign"}
    assert all(hasattr(pk, n) for n in pk.__all__)


def test_stdlib_json_fallback_reads_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_json_loads", None)  # as where orjson is not installed
    data = pk.encode(GOOD, SECRET)
    assert pk.decode_task(data, SECRET, now=NOW) == GOOD
    reject(data.replace(b'{"attrs"', b'{"op":"evil","attrs"'), "bad_signature")
    reject(data.replace(b"1.5", b"NaN"), "bad_signature")
    reject(sign_text(b'{"a":NaN}'), "invalid")  # not JSON; YAML reads the string "NaN"
    reject(b"{" * 1400, "unsigned")


# --- carried values (proto/packet.md, "Carried values") ---------------------------------------

_U0, _U1 = "u-" + "a" * 32, "u-" + "b" * 32


def _carrying(data: dict[str, Any], pull: dict[str, str] | None = None) -> dict[str, Any]:
    pull = {_U1: "scheduler"} if pull is None else pull
    p = pk.TaskPacket("j1.g.a0", "graph", (_U0, _U1), ("j1.n3",), 1e9 + 10, pull, {}, "n1", 1e9)
    wire = task_to_wire(p)
    wire["data"] = data
    return wire


def test_a_carried_value_round_trips_bit_exact_and_is_signed() -> None:
    rng = np.random.default_rng()
    x = rng.standard_normal((16, 64)).astype(np.float32)
    p = pk.TaskPacket("j1.g.a0", "graph", (_U0, _U1), ("j1.n3",), 1e9 + 10, {_U1: "scheduler"}, {}, "n1", 1e9,
                      {_U0: pk.Carried(x.shape, "float32", x.tobytes())})
    data = pk.encode_task(p, SECRET)
    assert codec._task_body_checked(p) == codec.canonical(task_to_wire(p))  # the fast writer: the same bytes
    q = pk.decode_task(data, SECRET, now=1e9, max_bytes=pk.MAX_FRAME_BYTES)
    assert q == p and np.array_equal(np.frombuffer(q.data[_U0].data, np.float32).reshape(16, 64), x)
    flipped = data.replace(b'"b64":"', b'"b64":"A', 1)  # a character more: the signature fails
    with pytest.raises(pk.PacketSignatureError):
        pk.decode_task(flipped, SECRET, now=1e9, max_bytes=pk.MAX_FRAME_BYTES)


@pytest.mark.parametrize(("data", "field", "words"), [
    ({}, "data", "non-empty"),
    ({_U1: {"shape": [1], "dtype": "float32", "b64": "AAAAAA=="}}, f"data.{_U1}", "not pulled"),
    ({"j1.other": {"shape": [1], "dtype": "float32", "b64": "AAAAAA=="}}, "data.j1.other", "an input"),
    ({_U0: {"shape": [2], "dtype": "float32", "b64": "AAAAAA=="}}, f"data.{_U0}.b64", "4 bytes"),
    ({_U0: {"shape": [1], "dtype": "float32", "b64": "AA!AAA=="}}, f"data.{_U0}.b64", "base64"),
    ({_U0: {"shape": [1], "dtype": "complex7", "b64": "AAAAAA=="}}, f"data.{_U0}.dtype", "dtype"),
    ({_U0: {"shape": [-1], "dtype": "float32", "b64": ""}}, f"data.{_U0}.shape", "dimensions"),
    ({_U0: {"shape": [1], "dtype": "float32"}}, f"data.{_U0}", "missing ['b64']"),
    ({_U0: {"shape": [8193, 1], "dtype": "float32", "b64": "A" * 43696}}, f"data.{_U0}.b64", "at most"),
])
def test_a_bad_carried_value_is_refused_naming_its_field(data: dict[str, Any], field: str,
                                                         words: str) -> None:
    with pytest.raises(pk.PacketInvalid) as e:
        task_from_wire(_carrying(data))
    assert e.value.field == field and words in str(e.value), (e.value.field, str(e.value))


def test_carried_values_are_bounded_in_all() -> None:
    half = pk.CARRY_MAX_BYTES // 2 + 4
    blob = {"shape": [half], "dtype": "uint8", "b64": base64.b64encode(bytes(half)).decode()}
    with pytest.raises(pk.PacketInvalid, match="carries more than") as e:
        task_from_wire(_carrying({_U0: blob, _U1: blob}, pull={}))
    assert e.value.field == "data"


def _reply_carrying(data: dict[str, Any], ok: bool = True) -> dict[str, Any]:
    r = pk.Reply("j1.g.a0", True, pk.Timings(1e9, 1e9, 1e9 + 1),
                 (pk.TileInfo("j1.loss", (), "float32", 4), pk.TileInfo("j1.w", (8, 8), "float32", 256)))
    wire = schema.reply_to_wire(r)
    wire["data"] = data
    if not ok:
        wire.update(ok=False, outputs=[], error={"kind": "infra", "message": "x"})
    return wire


def test_a_reply_carries_small_output_values_bit_exact() -> None:
    loss = np.float32(np.random.default_rng().standard_normal())
    r = pk.Reply("j1.g.a0", True, pk.Timings(1e9, 1e9, 1e9 + 1), (pk.TileInfo("j1.loss", (), "float32", 4),),
                 None, {"j1.loss": pk.Carried((), "float32", loss.tobytes())})
    q = pk.decode_reply(pk.encode_reply(r, SECRET), SECRET, max_bytes=pk.MAX_DATAGRAM_BYTES)
    assert q == r and np.frombuffer(q.data["j1.loss"].data, np.float32)[0] == loss


@pytest.mark.parametrize(("data", "ok", "field", "words"), [
    ({"j1.other": {"shape": [], "dtype": "float32", "b64": "AAAAAA=="}}, True, "data.j1.other", "an output"),
    ({"j1.loss": {"shape": [1], "dtype": "float32", "b64": "AAAAAA=="}}, True, "data.j1.loss",
     "its output says"),
    ({"j1.loss": {"shape": [], "dtype": "float32", "b64": "AAAAAA=="}}, False, "data", "failed task"),
    ({"j1.w": {"shape": [8, 8], "dtype": "float32", "b64": base64.b64encode(bytes(256)).decode()},
      "j1.loss": {"shape": [], "dtype": "float32", "b64": "AAAAAA=="}}, True, "data", "more than 256"),
])
def test_a_bad_carried_output_is_refused_naming_its_field(data: dict[str, Any], ok: bool, field: str,
                                                         words: str) -> None:
    with pytest.raises(pk.PacketInvalid) as e:
        schema.reply_from_wire(_reply_carrying(data, ok))
    assert e.value.field == field and words in str(e.value), (e.value.field, str(e.value))
