"""The data port's wire format (proto/dataport.md): tags, nonces, error kinds (no sockets)."""

from __future__ import annotations

import json

import pytest

from triplane.proto.dataport import (
    CHUNK_BYTES,
    LENGTH,
    MAX_DELETE_TILES,
    TAG_BYTES,
    ChunkMac,
    DataPortError,
    NonceGuard,
    Request,
    Response,
    chunk_count,
    encode_request,
    encode_response,
    parse_request,
    parse_response,
    refusal,
    unverified_error,
    verify_request,
    verify_response,
)

SECRET = b"dataport-unit-test-secret"
OTHER = b"another-secret-of-enough-bytes"
NOW = 1_750_000_000.0
NONCE = bytes(range(16))


def split(frame: bytes) -> tuple[bytes, bytes]:
    (n,) = LENGTH.unpack(frame[:4])
    assert len(frame) == 4 + TAG_BYTES + n
    return frame[4:4 + TAG_BYTES], frame[4 + TAG_BYTES:]


def test_requests_round_trip_with_a_fresh_nonce_each() -> None:
    frame, nonce = encode_request("get", SECRET, now=NOW, tile="j1.n0")
    tag, header = split(frame)
    assert verify_request(tag, header, SECRET)
    assert parse_request(header) == Request("get", nonce, NOW, tile="j1.n0")
    assert encode_request("get", SECRET, now=NOW, tile="j1.n0")[1] != nonce  # random every time
    frame, nonce = encode_request("put", SECRET, now=NOW, tile="u-1", shape=(3, 4), dtype="float16",
                                  nbytes=24)
    assert parse_request(split(frame)[1]) == Request("put", nonce, NOW, "u-1", (), (3, 4), "float16", 24)
    frame, nonce = encode_request("delete", SECRET, now=NOW, tiles=("a", "b"))
    assert parse_request(split(frame)[1]) == Request("delete", nonce, NOW, tiles=("a", "b"))


def test_a_request_tag_covers_every_header_byte_and_the_secret() -> None:
    tag, header = split(encode_request("stat", SECRET, now=NOW, tile="t1", nonce=NONCE)[0])
    assert json.loads(header) == {"v": 1, "op": "stat", "tile": "t1", "nonce": NONCE.hex(), "t": NOW}
    assert not verify_request(tag, header, OTHER)
    assert not verify_request(tag, header.replace(b"t1", b"t2"), SECRET)
    assert not verify_request(bytes(TAG_BYTES), header, SECRET)


def test_bad_requests_raise_with_kind_request() -> None:
    def header(**d: object) -> bytes:
        return json.dumps({"v": 1, "op": "get", "tile": "t", "nonce": NONCE.hex(), "t": NOW, **d}).encode()

    for bad, match in [(header(op="rm"), "unknown op"), (header(tile="a b"), "not a tile id"),
                       (header(nonce="xyz"), "nonce"), (header(t="now"), "'t'"), (header(v=2), "version"),
                       (header(op="put", shape=[2], dtype="float32", bytes=9), "8 bytes"),
                       (header(op="delete", tiles=["a"] * (MAX_DELETE_TILES + 1)), "at most")]:
        with pytest.raises(DataPortError, match=match) as err:
            parse_request(bad)
        assert err.value.kind == "request"
    with pytest.raises(DataPortError, match="malformed") as err:
        parse_request(b"[1]")
    assert err.value.kind == "protocol"


def test_nonces_are_single_use_within_the_window() -> None:
    g = NonceGuard(window=30.0)
    g.check(b"a" * 16, NOW, NOW + 1)
    with pytest.raises(DataPortError, match="replayed") as err:
        g.check(b"a" * 16, NOW, NOW + 2)
    assert err.value.kind == "replay"
    for t in (NOW - 31, NOW + 31):
        with pytest.raises(DataPortError, match="stale") as err:
            g.check(b"b" * 16, t, NOW)
        assert err.value.kind == "stale"
    g.check(b"c" * 16, NOW + 40, NOW + 40)  # the first nonce expired with its window
    assert len(g) == 1


def test_a_full_nonce_memory_refuses_what_it_forgot() -> None:
    g = NonceGuard(window=30.0, capacity=2)
    g.check(b"1" * 16, NOW, NOW)
    g.check(b"2" * 16, NOW + 1, NOW + 1)
    g.check(b"3" * 16, NOW + 2, NOW + 2)  # forgets nonce 1: requests up to its time are refused
    with pytest.raises(DataPortError, match="older than the replay memory"):
        g.check(b"1" * 16, NOW, NOW + 3)
    assert len(g) == 2 and g.floor == NOW


def test_responses_are_bound_to_the_request_nonce() -> None:
    frame = encode_response(SECRET, NONCE, True, shape=(2, 3), dtype="float32", nbytes=24)
    tag, header = split(frame)
    assert verify_response(tag, header, NONCE, SECRET)
    assert parse_response(header) == Response(True, None, None, (2, 3), "float32", 24)
    assert not verify_response(tag, header, bytes(16), SECRET)  # a recorded answer to another request
    assert not verify_response(tag, header, NONCE, OTHER)


def test_errors_carry_a_structured_kind() -> None:
    tag, header = split(encode_response(SECRET, NONCE, False, kind="missing", message="no such tile: x"))
    assert verify_response(tag, header, NONCE, SECRET)
    r = parse_response(header)
    assert (r.ok, r.kind, r.message) == (False, "missing", "no such tile: x")
    assert DataPortError("gone", kind="missing").missing
    assert not DataPortError("no such tile: x", kind="unavailable").missing  # never read from the text
    assert DataPortError("x", kind="nonsense").kind == "protocol"


def test_a_refusal_is_never_authentic_but_can_be_quoted() -> None:
    tag, header = split(refusal("unauthorized: wrong secret"))
    assert tag == bytes(TAG_BYTES) and not verify_response(tag, header, NONCE, SECRET)
    assert unverified_error(tag, header) == "unauthorized: wrong secret"
    real_tag, real = split(encode_response(SECRET, NONCE, False, kind="missing", message="m"))
    assert unverified_error(real_tag, real) is None


def test_chunk_tags_bind_secret_nonce_index_and_bytes() -> None:
    mac = ChunkMac(SECRET, "get", NONCE)
    tag = mac.tag(0, b"data")
    assert mac.check(0, b"data", tag)
    assert not mac.check(1, b"data", tag)
    assert not mac.check(0, b"datb", tag)
    assert not ChunkMac(SECRET, "get", bytes(16)).check(0, b"data", tag)
    assert not ChunkMac(SECRET, "put", NONCE).check(0, b"data", tag)
    assert not ChunkMac(OTHER, "get", NONCE).check(0, b"data", tag)
    assert [chunk_count(n) for n in (0, 1, CHUNK_BYTES, CHUNK_BYTES + 1)] == [0, 1, 1, 2]


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        encode_request("get", b"short", now=NOW, tile="x")
