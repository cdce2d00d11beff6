"""The data port's wire format (docs/runtime.md, "The data port"): pure, no sockets.

A frame is a 4-byte big-endian length and that many bytes of canonical JSON
(``triplane.proto.packet.canonical``), at most 64 KiB. Frames that carry data are
followed by exactly ``bytes`` raw bytes (C order, little-endian).

Requests are signed: ``sig`` is HMAC-SHA256 (cluster secret) over the canonical JSON of
the header without ``sig``; a request without one, with a wrong one, or whose ``t`` is
more than 30 s from the receiver's clock is refused. Every refusal here raises
``DataPortError`` with a message for the peer; nothing else escapes ``parse_*``.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import struct
import time
from typing import Any, Literal, NamedTuple

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.errors import TriplaneError
from triplane.proto.limits import MAX_RANK
from triplane.proto.packet import PacketError, canonical, sign

__all__ = [
    "FRESHNESS_S", "HEADER", "MAX_HEADER_BYTES", "DataPortError", "Request", "Response",
    "array_bytes", "make_request", "make_response", "parse_request", "parse_response",
]

MAX_HEADER_BYTES = 64 * 1024
FRESHNESS_S = 30.0
HEADER = struct.Struct(">I")
MAX_NDIM = MAX_RANK  # one limit for the whole system (triplane.proto.limits)
MAX_DELETE_TILES = 4096

Op = Literal["get", "put", "delete", "stat"]
_OPS = frozenset(("get", "put", "delete", "stat"))
_TILE = re.compile(r"[A-Za-z0-9_.:/@+=,~-]{1,128}")
_SIG = re.compile(r"[0-9a-f]{64}")


class DataPortError(TriplaneError, ConnectionError):
    """A data-port request failed: refused or answered ``ok: false`` by the peer (the
    message is the peer's, e.g. ``no such tile: j1.n3``), or the connection failed or
    timed out. ``missing`` is true when the peer said it does not hold the tile."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        self.missing = missing
        super().__init__(message)


class Request(NamedTuple):
    op: Op
    tile: str | None = None
    tiles: tuple[str, ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int = 0


class Response(NamedTuple):
    ok: bool
    error: str | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int = 0


def _frame(header: dict[str, Any]) -> bytes:
    body = canonical(header)
    if len(body) > MAX_HEADER_BYTES:
        raise DataPortError(f"header of {len(body)} bytes exceeds {MAX_HEADER_BYTES}")
    return HEADER.pack(len(body)) + body


def array_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a C-order array of that shape and dtype (``DataPortError`` for an unknown
    dtype or a bad shape)."""
    if dtype not in dt.BY_NAME:
        raise DataPortError(f"unknown dtype {dtype!r} (known: {sorted(dt.BY_NAME)})")
    if len(shape) > MAX_NDIM or any(type(s) is not int or s < 0 for s in shape):
        raise DataPortError(f"bad shape {list(shape)!r}: at most {MAX_NDIM} non-negative ints")
    return math.prod(shape) * dt.BY_NAME[dtype].itemsize


def make_request(op: Op, secret: bytes, *, tile: str | None = None, tiles: tuple[str, ...] = (),
                 array: np.ndarray | None = None, now: float | None = None) -> bytes:
    """A signed request header frame. ``put`` takes ``array`` (its shape/dtype/bytes go in the
    header; the caller sends its bytes after the frame); ``delete`` takes ``tiles``."""
    header: dict[str, Any] = {"op": op, "t": time.time() if now is None else now}
    if op == "delete":
        header["tiles"] = list(tiles)
    else:
        header["tile"] = tile
    if op == "put":
        if array is None:
            raise ValueError("put needs an array")
        header.update(shape=list(array.shape), dtype=dt.dtype(array.dtype).name, bytes=int(array.nbytes))
    header["sig"] = sign(canonical(header), secret)
    return _frame(header)


def make_response(ok: bool, error: str | None = None, *, shape: tuple[int, ...] | None = None,
                  dtype: str | None = None, nbytes: int = 0) -> bytes:
    return _frame({"ok": ok, "error": error, "shape": None if shape is None else list(shape),
                   "dtype": dtype, "bytes": nbytes})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _load(payload: bytes) -> dict[str, Any]:
    try:
        d = json.loads(payload, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise DataPortError(f"malformed header: {e}") from None
    if type(d) is not dict:
        raise DataPortError("malformed header: not a JSON object")
    return d


def _tile(v: Any, field: str) -> str:
    if type(v) is not str or _TILE.fullmatch(v) is None:
        raise DataPortError(f"bad request: {field!r} is not a tile id: {v!r:.80}")
    return v


def parse_request(payload: bytes, secret: bytes, *, now: float | None = None) -> Request:
    """Check and decode a request header: signature, freshness, fields (in that order)."""
    d = _load(payload)
    sig = d.pop("sig", None)
    if type(sig) is not str or _SIG.fullmatch(sig) is None:
        raise DataPortError("unauthorized: the request is unsigned")
    try:
        expected = sign(canonical(d), secret)
    except PacketError as e:
        raise DataPortError(f"malformed header: {e}") from None
    if not hmac.compare_digest(expected, sig):
        raise DataPortError("unauthorized: bad signature (wrong cluster secret?)")
    t = d.get("t")
    if type(t) not in (int, float):
        raise DataPortError("bad request: 't' (unix time) is missing or not a number")
    now = time.time() if now is None else now
    if abs(now - t) > FRESHNESS_S:
        raise DataPortError(f"unauthorized: stale request ({now - t:.1f} s old; bound {FRESHNESS_S:.0f} s)")
    op = d.get("op")
    if op not in _OPS:
        raise DataPortError(f"bad request: unknown op {op!r} (known: {sorted(_OPS)})")
    if op == "delete":
        tiles = d.get("tiles")
        if type(tiles) is not list or len(tiles) > MAX_DELETE_TILES:
            raise DataPortError(f"bad request: 'tiles' must be a list of at most {MAX_DELETE_TILES} ids")
        return Request("delete", tiles=tuple(_tile(x, "tiles") for x in tiles))
    tile = _tile(d.get("tile"), "tile")
    if op != "put":
        return Request(op, tile=tile)
    shape, dtype, nbytes = d.get("shape"), d.get("dtype"), d.get("bytes")
    if type(shape) is not list or type(dtype) is not str or type(nbytes) is not int:
        raise DataPortError("bad request: put needs 'shape' (list), 'dtype' (str) and 'bytes' (int)")
    shape_t = tuple(shape)
    if array_bytes(shape_t, dtype) != nbytes:
        raise DataPortError(f"bad request: {dtype}{list(shape_t)} is {array_bytes(shape_t, dtype)} "
                            f"bytes, the header says {nbytes}")
    return Request("put", tile=tile, shape=shape_t, dtype=dtype, bytes=nbytes)


def parse_response(payload: bytes) -> Response:
    """Decode a response header; ``DataPortError`` if it is malformed."""
    d = _load(payload)
    ok, error = d.get("ok"), d.get("error")
    if type(ok) is not bool or not (error is None or type(error) is str):
        raise DataPortError("malformed response: 'ok' must be a bool and 'error' a string or null")
    if not ok:
        return Response(False, error or "unknown error")
    shape, dtype, nbytes = d.get("shape"), d.get("dtype"), d.get("bytes", 0)
    if shape is None:
        return Response(True)
    if type(shape) is not list or type(dtype) is not str or type(nbytes) is not int:
        raise DataPortError("malformed response: bad 'shape', 'dtype' or 'bytes'")
    shape_t = tuple(shape)
    if array_bytes(shape_t, dtype) != nbytes:
        raise DataPortError(f"malformed response: {dtype}{list(shape_t)} is not {nbytes} bytes")
    return Response(True, None, shape_t, dtype, nbytes)
