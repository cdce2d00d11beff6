"""The data port's wire format (``proto/dataport.md``): pure, no sockets, no clocks of its own.

Every message on a data port is authenticated with the cluster secret (HMAC-SHA256), and
the tag is checked over the raw bytes *before* anything is parsed:

* a **frame** is ``>I`` length ``n`` (1..bound), a 32-byte tag, then ``n`` bytes of header
  (canonical JSON). A request's tag covers its header; a response's tag covers the
  request's nonce and its header, so a recorded response answers no other request;
* **data** (a ``get``'s tile, a ``put``'s bytes) follows its header in chunks of
  ``CHUNK_BYTES`` (the last one shorter), each followed by its own 16-byte Poly1305 tag
  under a one-time key derived from the secret, the nonce and the chunk's index
  (HMAC-SHA256; Poly1305 runs at ~10 GB/s where HMAC-SHA256 over the bytes ran at ~1.7):
  a reader hands out a chunk only once its tag matched, and the header's ``bytes``
  (authenticated) fixes how many chunks there are;
* every request carries a fresh 16-byte ``nonce`` and its sender's time ``t``; a server
  accepts a nonce once (``NonceGuard``) and only within ``FRESHNESS_S`` of its clock.

Failures raise ``DataPortError`` with a machine-readable ``kind`` (``KINDS``); the error a
server answers travels as ``{"kind", "message"}`` in the response header, so a client
knows a tile is missing from ``kind == "missing"``, never from the message text.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import struct
from collections import OrderedDict
from typing import Any, Literal, NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.poly1305 import Poly1305

from triplane.proto import dtypes as dt
from triplane.proto.errors import TriplaneError
from triplane.proto.limits import MAX_RANK
from triplane.proto.packet import canonical

__all__ = [
    "CHUNK_BYTES", "CHUNK_TAG_BYTES", "FRESHNESS_S", "KINDS", "LENGTH", "MAX_DELETE_TILES",
    "MAX_REQUEST_HEADER", "MAX_RESPONSE_HEADER", "NONCE_BYTES", "TAG_BYTES", "VERSION", "ChunkMac",
    "DataPortError",
    "NonceGuard", "Request", "Response", "array_bytes", "chunk_count", "encode_request",
    "encode_response", "parse_request", "parse_response", "refusal", "unverified_error",
    "verify_request", "verify_response",
]

VERSION = 1
LENGTH = struct.Struct(">I")
TAG_BYTES = 32  # a frame's tag: HMAC-SHA256
CHUNK_TAG_BYTES = 16  # a data chunk's tag: Poly1305
NONCE_BYTES = 16
CHUNK_BYTES = 1 << 20
MAX_REQUEST_HEADER = 64 * 1024
MAX_RESPONSE_HEADER = 4096
MAX_DELETE_TILES = 256  # 256 ids of at most 128 characters fit a request header
MAX_NDIM = MAX_RANK  # one limit for the whole system (triplane.proto.limits)
MAX_MESSAGE_CHARS = 1000
FRESHNESS_S = 30.0

# Error kinds a response (or the client itself) reports:
KINDS = frozenset({
    "missing",          # the server does not hold the tile
    "full",             # a put does not fit the server's memory
    "refused",          # the server does not do this op (the scheduler's port is read-only)
    "request",          # the request is malformed (fields, sizes)
    "stale",            # the request's time is outside the freshness window
    "replay",           # the request's nonce was seen before
    "unauthorized",     # the server could not authenticate the request (wrong secret)
    "unauthenticated",  # the response failed verification: wrong secret or an impostor
    "protocol",         # the peer broke the framing or sent an unreadable header
    "unavailable",      # cannot connect, timed out, connection lost
})

_REQ, _RESP = b"triplane-data/request\0", b"triplane-data/response\0"
_BODY = {"get": b"triplane-data/tile\0", "put": b"triplane-data/put\0"}
_OPS = frozenset(("get", "put", "delete", "stat"))
_TILE = re.compile(r"[A-Za-z0-9_.:/@+=,~-]{1,128}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_INDEX = struct.Struct(">Q")
_ZERO_TAG = bytes(TAG_BYTES)

Op = Literal["get", "put", "delete", "stat"]


class DataPortError(TriplaneError, ConnectionError):
    """A data-port request failed. ``kind`` (one of ``KINDS``) says why in a form code can
    act on: ``missing`` -- the peer does not hold the tile (retrying elsewhere or
    recomputing helps); ``unauthenticated`` -- the answer was not from a holder of the
    cluster secret (a poisoned address or a misconfigured node); and so on."""

    def __init__(self, message: str, *, kind: str = "protocol") -> None:
        self.kind = kind if kind in KINDS else "protocol"
        super().__init__(message)

    @property
    def missing(self) -> bool:
        return self.kind == "missing"


class Request(NamedTuple):
    op: Op
    nonce: bytes
    t: float
    tile: str | None = None
    tiles: tuple[str, ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int = 0


class Response(NamedTuple):
    ok: bool
    kind: str | None = None
    message: str | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int = 0


# --- keys ------------------------------------------------------------------------------

_BASES: dict[tuple[bytes, bytes], Any] = {}


def _base(secret: bytes, domain: bytes) -> Any:
    """An HMAC-SHA256 state keyed with ``secret`` that has absorbed ``domain``: copying it
    costs a third of keying a new one, which matters for small frames."""
    key = (secret, domain)
    h = _BASES.get(key)
    if h is None:
        if type(secret) is not bytes or len(secret) < 16:
            raise ValueError("the cluster secret must be bytes of at least 16 bytes")
        if len(_BASES) >= 32:
            _BASES.clear()
        h = _BASES[key] = hmac.new(secret, domain, hashlib.sha256)
    return h


def _tag(secret: bytes, domain: bytes, *parts: bytes | memoryview) -> bytes:
    h = _base(secret, domain).copy()
    for p in parts:
        h.update(p)
    return h.digest()


class ChunkMac:
    """Tags of the data chunks of one message: ``tag(i, chunk)`` = Poly1305(key_i, chunk)
    with the one-time key ``key_i`` = HMAC-SHA256(secret, domain || nonce || i as 8 bytes).
    ``op`` is ``get`` (a tile sent by a server) or ``put`` (bytes sent by a client). A key is
    never used twice: the nonce is fresh per request (and single-use at the server), the
    domain separates the two directions, the index the chunks. Both calls release the GIL
    while they hash, so a big chunk may be tagged in a worker thread."""

    def __init__(self, secret: bytes, op: Literal["get", "put"], nonce: bytes) -> None:
        self._h = _base(secret, _BODY[op]).copy()
        self._h.update(nonce)

    def _key(self, index: int) -> bytes:
        h = self._h.copy()
        h.update(_INDEX.pack(index))
        return h.digest()

    def tag(self, index: int, chunk: bytes | memoryview | bytearray) -> bytes:
        return Poly1305.generate_tag(self._key(index), chunk)

    def check(self, index: int, chunk: bytes | memoryview | bytearray, tag: bytes | memoryview) -> bool:
        try:
            Poly1305.verify_tag(self._key(index), chunk, bytes(tag))
        except InvalidSignature:
            return False
        return True


def chunk_count(nbytes: int) -> int:
    """How many chunks ``nbytes`` of data travel in (0 for none)."""
    return -(-nbytes // CHUNK_BYTES)


# --- requests ----------------------------------------------------------------------------


def array_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a C-order array of that shape and dtype (``DataPortError`` of kind
    ``request`` for an unknown dtype or a bad shape)."""
    if dtype not in dt.BY_NAME:
        raise DataPortError(f"unknown dtype {dtype!r} (known: {sorted(dt.BY_NAME)})", kind="request")
    if len(shape) > MAX_NDIM or any(type(s) is not int or s < 0 for s in shape):
        raise DataPortError(f"bad shape {list(shape)!r}: at most {MAX_NDIM} non-negative ints",
                            kind="request")
    return math.prod(shape) * dt.BY_NAME[dtype].itemsize


def _frame(tag: bytes, header: bytes, bound: int) -> bytes:
    if not 0 < len(header) <= bound:
        raise DataPortError(f"header of {len(header)} bytes (bound 1..{bound})", kind="request")
    return LENGTH.pack(len(header)) + tag + header


def encode_request(op: Op, secret: bytes, *, now: float, tile: str | None = None,
                   tiles: tuple[str, ...] = (), shape: tuple[int, ...] | None = None,
                   dtype: str | None = None, nbytes: int = 0,
                   nonce: bytes | None = None) -> tuple[bytes, bytes]:
    """(the request frame, its nonce). ``put`` takes ``shape``/``dtype``/``nbytes`` (its data
    follows the frame in tagged chunks, ``ChunkMac(secret, "put", nonce)``); ``delete`` takes
    ``tiles`` (at most ``MAX_DELETE_TILES``)."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    header: dict[str, Any] = {"v": VERSION, "op": op, "nonce": nonce.hex(), "t": float(now)}
    if op == "delete":
        if len(tiles) > MAX_DELETE_TILES:
            raise DataPortError(f"at most {MAX_DELETE_TILES} tiles per delete", kind="request")
        header["tiles"] = list(tiles)
    else:
        header["tile"] = tile
    if op == "put":
        if shape is None or dtype is None:
            raise ValueError("put needs shape, dtype and nbytes")
        header.update(shape=list(shape), dtype=dtype, bytes=int(nbytes))
    body = canonical(header)
    return _frame(_tag(secret, _REQ, body), body, MAX_REQUEST_HEADER), nonce


def verify_request(tag: bytes | memoryview, header: bytes, secret: bytes) -> bool:
    """True iff ``tag`` authenticates ``header`` (constant time). Call it before parsing."""
    return hmac.compare_digest(_tag(secret, _REQ, header), bytes(tag))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _load(header: bytes, what: str) -> dict[str, Any]:
    try:
        d = json.loads(header, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise DataPortError(f"malformed {what} header: {e}", kind="protocol") from None
    if type(d) is not dict:
        raise DataPortError(f"malformed {what} header: not a JSON object", kind="protocol")
    return d


def _tile(v: Any, field: str) -> str:
    if type(v) is not str or _TILE.fullmatch(v) is None:
        raise DataPortError(f"bad request: {field!r} is not a tile id: {v!r:.80}", kind="request")
    return v


def parse_request(header: bytes) -> Request:
    """The fields of an *authenticated* request header (``verify_request`` first). Freshness
    and single use are the server's ``NonceGuard``'s to decide."""
    d = _load(header, "request")
    if d.get("v") != VERSION:
        raise DataPortError(f"data-port protocol version {d.get('v')!r:.20} (this side speaks "
                            f"{VERSION})", kind="request")
    nonce, t, op = d.get("nonce"), d.get("t"), d.get("op")
    if type(nonce) is not str or _NONCE.fullmatch(nonce) is None:
        raise DataPortError("bad request: 'nonce' must be 32 lowercase hex digits", kind="request")
    if type(t) not in (int, float) or not math.isfinite(t):
        raise DataPortError("bad request: 't' (unix time) is missing or not a number", kind="request")
    if op not in _OPS:
        raise DataPortError(f"bad request: unknown op {op!r:.40} (known: {sorted(_OPS)})", kind="request")
    n = bytes.fromhex(nonce)
    if op == "delete":
        tiles = d.get("tiles")
        if type(tiles) is not list or len(tiles) > MAX_DELETE_TILES:
            raise DataPortError(f"bad request: 'tiles' must be a list of at most {MAX_DELETE_TILES} ids",
                                kind="request")
        return Request("delete", n, float(t), tiles=tuple(_tile(x, "tiles") for x in tiles))
    tile = _tile(d.get("tile"), "tile")
    if op != "put":
        return Request(op, n, float(t), tile=tile)
    shape, dtype, nbytes = d.get("shape"), d.get("dtype"), d.get("bytes")
    if type(shape) is not list or type(dtype) is not str or type(nbytes) is not int:
        raise DataPortError("bad request: put needs 'shape' (list), 'dtype' (str) and 'bytes' (int)",
                            kind="request")
    shape_t = tuple(shape)
    if array_bytes(shape_t, dtype) != nbytes:
        raise DataPortError(f"bad request: {dtype}{list(shape_t)} is {array_bytes(shape_t, dtype)} "
                            f"bytes, the header says {nbytes}", kind="request")
    return Request("put", n, float(t), tile=tile, shape=shape_t, dtype=dtype, bytes=nbytes)


class NonceGuard:
    """Single use of requests, in bounded memory. ``check(nonce, t, now)`` passes a request
    whose time is within ``window`` seconds of ``now`` and whose nonce it has not passed
    before, and remembers the nonce until the request would be stale anyway. When
    ``capacity`` nonces are remembered, the oldest is forgotten and every request no newer
    than it is refused from then on (``floor``): a replay is refused either way."""

    def __init__(self, window: float = FRESHNESS_S, capacity: int = 1 << 16) -> None:
        self.window = window
        self.capacity = capacity
        self.floor = -math.inf
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def check(self, nonce: bytes, t: float, now: float) -> None:
        """Raise ``DataPortError`` (``stale`` or ``replay``) or remember ``nonce``."""
        if abs(now - t) > self.window:
            raise DataPortError(f"stale request ({now - t:.1f} s old; bound {self.window:g} s: "
                                "are the clocks in sync?)", kind="stale")
        if t <= self.floor:
            raise DataPortError("stale request (older than the replay memory)", kind="stale")
        if nonce in self._seen:
            raise DataPortError("replayed request (its nonce was used before)", kind="replay")
        seen = self._seen
        while seen:  # forget nonces whose requests are stale anyway (roughly in time order)
            first = next(iter(seen.values()))
            if first >= now - self.window:
                break
            seen.popitem(last=False)
        if len(seen) >= self.capacity:
            _, oldest = seen.popitem(last=False)
            self.floor = max(self.floor, oldest)
        seen[nonce] = t

    def __len__(self) -> int:
        return len(self._seen)


# --- responses -----------------------------------------------------------------------------


def encode_response(secret: bytes, nonce: bytes, ok: bool, *, kind: str | None = None,
                    message: str | None = None, shape: tuple[int, ...] | None = None,
                    dtype: str | None = None, nbytes: int = 0) -> bytes:
    """A response frame answering the request of ``nonce``. An error has a ``kind`` (one of
    ``KINDS``) and a message (clipped to ``MAX_MESSAGE_CHARS``); a ``get``'s data follows
    in chunks tagged with ``ChunkMac(secret, "get", nonce)``."""
    if ok:
        header: dict[str, Any] = {"v": VERSION, "ok": True}
        if shape is not None:
            header.update(shape=list(shape), dtype=dtype, bytes=int(nbytes))
    else:
        header = {"v": VERSION, "ok": False,
                  "error": {"kind": kind or "protocol", "message": (message or "")[:MAX_MESSAGE_CHARS]}}
    body = canonical(header)
    return _frame(_tag(secret, _RESP, nonce, body), body, MAX_RESPONSE_HEADER)


def refusal(message: str, kind: str = "unauthorized") -> bytes:
    """The answer to a request that could not be authenticated (or read): a response frame
    with an all-zero tag, since no nonce of it can be trusted. A client never accepts it as
    an answer; it only quotes it in its error."""
    body = canonical({"v": VERSION, "ok": False,
                      "error": {"kind": kind, "message": message[:MAX_MESSAGE_CHARS]}})
    return LENGTH.pack(len(body)) + _ZERO_TAG + body


def verify_response(tag: bytes | memoryview, header: bytes, nonce: bytes, secret: bytes) -> bool:
    """True iff ``tag`` authenticates ``header`` as the answer to the request of ``nonce``."""
    return hmac.compare_digest(_tag(secret, _RESP, nonce, header), bytes(tag))


def unverified_error(tag: bytes | memoryview, header: bytes) -> str | None:
    """What a refusal (``refusal``) says, for an error message; None for anything else."""
    if bytes(tag) != _ZERO_TAG:
        return None
    try:
        d = json.loads(header)
        msg = d["error"]["message"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return msg[:200] if type(msg) is str and msg.isprintable() else None


def parse_response(header: bytes) -> Response:
    """The fields of an *authenticated* response header (``verify_response`` first)."""
    d = _load(header, "response")
    ok = d.get("ok")
    if d.get("v") != VERSION or type(ok) is not bool:
        raise DataPortError("malformed response: 'v' must be 1 and 'ok' a bool", kind="protocol")
    if not ok:
        err = d.get("error")
        if type(err) is not dict or type(err.get("kind")) is not str or type(err.get("message")) is not str:
            raise DataPortError("malformed response: 'error' must be {kind, message}", kind="protocol")
        kind = err["kind"] if err["kind"] in KINDS else "protocol"
        return Response(False, kind, err["message"])
    shape, dtype, nbytes = d.get("shape"), d.get("dtype"), d.get("bytes", 0)
    if shape is None:
        return Response(True)
    if type(shape) is not list or type(dtype) is not str or type(nbytes) is not int:
        raise DataPortError("malformed response: bad 'shape', 'dtype' or 'bytes'", kind="protocol")
    shape_t = tuple(shape)
    try:
        expected = array_bytes(shape_t, dtype)
    except DataPortError as e:
        raise DataPortError(f"malformed response: {e}", kind="protocol") from None
    if expected != nbytes:
        raise DataPortError(f"malformed response: {dtype}{list(shape_t)} is not {nbytes} bytes",
                            kind="protocol")
    return Response(True, None, None, shape_t, dtype, nbytes)

