"""Data-port request signing and verification, response headers (pure: no sockets)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from triplane.executor.datawire import (
    HEADER,
    DataPortError,
    Request,
    make_request,
    make_response,
    parse_request,
    parse_response,
)
from triplane.proto.packet import canonical, sign

SECRET = b"datawire-unit-test-secret"
NOW = 1_750_000_000.0


def payload(frame: bytes) -> bytes:
    (n,) = HEADER.unpack(frame[:4])
    assert len(frame) == 4 + n
    return frame[4:]


def signed(header: dict, secret: bytes = SECRET) -> bytes:
    return canonical({**header, "sig": sign(canonical(header), secret)})


def test_requests_round_trip() -> None:
    get = parse_request(payload(make_request("get", SECRET, tile="j1.n0", now=NOW)), SECRET, now=NOW + 1)
    assert get == Request("get", tile="j1.n0")
    arr = np.zeros((3, 4), np.float16)
    put = parse_request(payload(make_request("put", SECRET, tile="u-1", array=arr, now=NOW)), SECRET, now=NOW)
    assert put == Request("put", tile="u-1", shape=(3, 4), dtype="float16", bytes=24)
    dele = parse_request(payload(make_request("delete", SECRET, tiles=("a", "b"), now=NOW)), SECRET, now=NOW)
    assert dele == Request("delete", tiles=("a", "b"))


def test_header_is_canonical_json_signed_over_everything_but_sig() -> None:
    body = payload(make_request("stat", SECRET, tile="t1", now=NOW))
    d = json.loads(body)
    sig = d.pop("sig")
    assert sig == sign(canonical(d), SECRET) and body == canonical({**d, "sig": sig})


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.pop("sig"), "unsigned"),
    (lambda d: d.update(sig="0" * 64), "bad signature"),
    (lambda d: d.update(tile="j1.other"), "bad signature"),  # tampered after signing
    (lambda d: d.update(sig="XYZ"), "unsigned"),
])
def test_unsigned_forged_or_tampered_requests_are_refused(mutate, message) -> None:
    d = json.loads(payload(make_request("get", SECRET, tile="j1.n0", now=NOW)))
    mutate(d)
    with pytest.raises(DataPortError, match=message):
        parse_request(json.dumps(d).encode(), SECRET, now=NOW)


def test_wrong_secret_and_stale_requests_are_refused() -> None:
    body = payload(make_request("get", b"another-secret-of-16-bytes", tile="t", now=NOW))
    with pytest.raises(DataPortError, match="bad signature"):
        parse_request(body, SECRET, now=NOW)
    body = payload(make_request("get", SECRET, tile="t", now=NOW))
    parse_request(body, SECRET, now=NOW + 29.9)
    with pytest.raises(DataPortError, match="stale"):
        parse_request(body, SECRET, now=NOW + 30.1)
    with pytest.raises(DataPortError, match="stale"):
        parse_request(body, SECRET, now=NOW - 30.1)


@pytest.mark.parametrize(("header", "message"), [
    ({"op": "get", "tile": "a b!", "t": NOW}, "not a tile id"),
    ({"op": "get", "tile": "x" * 129, "t": NOW}, "not a tile id"),
    ({"op": "frob", "tile": "t", "t": NOW}, "unknown op"),
    ({"op": "get", "tile": "t"}, "'t'"),
    ({"op": "put", "tile": "t", "t": NOW, "shape": [2], "dtype": "float32", "bytes": 9}, "the header says 9"),
    ({"op": "put", "tile": "t", "t": NOW, "shape": [2], "dtype": "complex64", "bytes": 16}, "unknown dtype"),
    ({"op": "put", "tile": "t", "t": NOW, "shape": [-1], "dtype": "float32", "bytes": 0}, "bad shape"),
    ({"op": "put", "tile": "t", "t": NOW}, "put needs"),
    ({"op": "delete", "tiles": "t", "t": NOW}, "'tiles'"),
])
def test_signed_but_malformed_requests_are_refused_with_the_reason(header, message) -> None:
    with pytest.raises(DataPortError, match=message):
        parse_request(signed(header), SECRET, now=NOW)


@pytest.mark.parametrize("raw", [b"", b"\xff\xfe", b"[1]", b'{"a": NaN}', b"{" * 5000])
def test_garbage_is_refused_not_crashed_on(raw: bytes) -> None:
    with pytest.raises(DataPortError):
        parse_request(raw, SECRET, now=NOW)


def test_responses() -> None:
    ok = parse_response(payload(make_response(True, shape=(2, 3), dtype="int8", nbytes=6)))
    assert (ok.ok, ok.shape, ok.dtype, ok.bytes) == (True, (2, 3), "int8", 6)
    err = parse_response(payload(make_response(False, "no such tile: t")))
    assert (err.ok, err.error) == (False, "no such tile: t")
    assert parse_response(payload(make_response(True))).shape is None
    with pytest.raises(DataPortError, match="malformed response"):
        parse_response(canonical({"ok": True, "error": None, "shape": [2], "dtype": "int8", "bytes": 5}))
    with pytest.raises(DataPortError, match="malformed response"):
        parse_response(b'{"ok": "yes"}')
