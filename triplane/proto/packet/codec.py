"""Canonical form, signature, parsing (JSON fast path, safe YAML fallback), encode/decode."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import yaml

from triplane.proto import dtypes as dt
from triplane.proto.limits import MAX_RANK
from triplane.proto.packet.errors import (
    PacketError,
    PacketMalformed,
    PacketSignatureError,
    PacketStale,
    PacketTooLarge,
    PacketVersionError,
    invalid_field,
)
from triplane.proto.packet.schema import (
    _INT64,
    CARRY_MAX_BYTES,
    DEFAULT_GRACE,
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_AHEAD,
    MAX_DATAGRAM_BYTES,
    MAX_DEPTH,
    MAX_FRAME_BYTES,
    MIN_SECRET_BYTES,
    VERSION,
    Control,
    Message,
    Reply,
    TaskPacket,
    _attrs,
    _BadValue,
    _dtype_match,
    _id_match,
    _ids_match,
    _task_id_match,
    _value,
    control_from_wire,
    control_to_wire,
    reply_from_wire,
    reply_to_wire,
    task_from_wire,
    task_to_wire,
)
from triplane.proto.safeyaml import SafeLoader, YamlRefused, bounded_load

try:  # orjson is optional: about 3x faster than the stdlib on the decode fast path
    import orjson

    _json_loads: Any = orjson.loads
except ImportError:  # pragma: no cover - exercised where orjson is not installed
    _json_loads = None


# --- canonical form ------------------------------------------------------------------

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True,
                            separators=(",", ":"), check_circular=False)


def _make_fast_encoder() -> Any:
    # JSONEncoder.encode rebuilds its C encoder on every call; building it once halves the
    # cost of a small packet. The constructor is CPython-private, hence the guarded probe.
    try:
        from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]

        enc = c_make_encoder(None, _ENCODER.default, c_encode_basestring, None, ":", ",",
                             True, False, False)
        probe = {"b": [1.5, None, True], "a": "\u00e9"}
        if "".join(enc(probe, 0)) == _ENCODER.encode(probe):
            return lambda o: "".join(enc(o, 0))
    except Exception:  # pragma: no cover - another Python implementation
        pass
    return _ENCODER.encode  # pragma: no cover


_encode_json = _make_fast_encoder()
# Characters JSON leaves raw but YAML refuses (DEL, C1 controls, non-characters) or reads as
# line breaks (NEL, U+2028/9, folded inside quotes); and floats repr() writes without a '.',
# which YAML 1.1 reads as strings ("1e+16"). Both are rare: cheap substring tests first.
_UNSAFE_RE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![0-9.])(-?[0-9]+)(e[+-][0-9]+)')


def _fix_token(m: re.Match[str]) -> str:
    if m.group(1) is not None:
        return f"{m.group(1)}.0{m.group(2)}"
    return _UNSAFE_RE.sub(lambda c: f"\\u{ord(c.group()):04x}", m.group(0))


def canonical(obj: Any) -> bytes:
    """The canonical bytes of a JSON-like value (see ``proto/packet.md``): the exact input of
    the signature. The value must already be schema-valid (finite floats, str keys, no
    lone surrogates); otherwise ``PacketInvalid``."""
    try:
        s = _encode_json(obj)
        if "e+" in s or "e-" in s or "\x7f" in s or (not s.isascii() and _UNSAFE_RE.search(s)):
            s = _TOKEN.sub(_fix_token, s)
        return s.encode("utf-8")
    except UnicodeEncodeError:
        invalid_field("", "a string is not valid Unicode (lone surrogate)")
    except (TypeError, ValueError, RecursionError) as e:
        invalid_field("", f"not encodable: {e}")


_PADS: dict[bytes, tuple[Any, Any]] = {}


def _pads(secret: bytes) -> tuple[Any, Any]:
    """SHA-256 states after the HMAC inner and outer key blocks (RFC 2104), per secret: copying
    them costs less than half of ``hmac.digest``, which rehashes the key every call."""
    pads = _PADS.get(secret) if type(secret) is bytes else None
    if pads is None:
        if type(secret) is not bytes or len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the cluster secret must be bytes of at least {MIN_SECRET_BYTES} bytes")
        key = (hashlib.sha256(secret).digest() if len(secret) > 64 else secret).ljust(64, b"\0")
        pads = (hashlib.sha256(bytes(b ^ 0x36 for b in key)), hashlib.sha256(bytes(b ^ 0x5C for b in key)))
        if len(_PADS) >= 8:  # a process holds one or two secrets (rotation); stay bounded anyway
            _PADS.clear()
        _PADS[secret] = pads
    return pads


def sign(body: bytes, secret: bytes) -> str:
    """HMAC-SHA256 of canonical ``body`` under ``secret`` (at least 16 bytes, else
    ``ValueError``), lowercase hex."""
    inner_pad, outer_pad = _pads(secret)
    inner = inner_pad.copy()
    inner.update(body)
    outer = outer_pad.copy()
    outer.update(inner.digest())
    return outer.hexdigest()


def _task_body(w: dict[str, Any]) -> bytes:
    """``canonical(w)`` for a validated task wire dict, written field by field: ids are
    charset-checked (nothing to escape), so only attrs go through the JSON encoder. The
    tests pin it equal to ``canonical``."""
    attrs, src, op, task, to = w["attrs"], w["from"], w["op"], w["task"], w["to"]
    attrs_text = canonical(attrs).decode() if attrs else "{}"
    deadline, t = canonical(w["deadline"]).decode(), canonical(w["t"]).decode()
    pairs = ",".join([f'"{k}":"{src[k]}"' for k in sorted(src)])
    ins = ",".join([f'"{x}"' for x in w["in"]])
    outs = ",".join([f'"{x}"' for x in w["out"]])
    return (f'{{"attrs":{attrs_text},"deadline":{deadline},"from":{{{pairs}}},"in":[{ins}],'
            f'"op":"{op}","out":[{outs}],"t":{t},"task":"{task}","to":"{to}","v":{VERSION}}}').encode()


# --- fast writers ----------------------------------------------------------------------
# The encoder must never emit what the decoder refuses. Re-running the decoder's check on
# the wire dict costs as much as writing it, so the common messages are checked on the
# fields directly, by the decoder's own rules (its id regexes, ``_value`` for attrs), and
# written in the same pass. Anything these writers cannot prove valid -- an unusual
# type, a float with an exponent, an error reply -- returns None and takes the general
# path (``*_to_wire``, ``*_from_wire``, ``canonical``), which explains what is wrong. The
# tests pin both paths to the same bytes and the fast one to accept only what decodes.

_V = str(VERSION)


def _float_text(x: Any) -> str | None:
    """``canonical(x)`` for a float written without an exponent (finite), else None."""
    if type(x) is not float:
        return None
    s = float.__repr__(x)
    return None if "e" in s or "n" in s else s  # "1e+16" needs fixing; "nan"/"inf" are refused


def attrs_text(attrs: Mapping[str, Any]) -> str:
    """The canonical JSON text of a task's ``attrs``, as :func:`encode_task` writes it;
    ``PacketInvalid`` naming the field the decoder would refuse. A sender that sends one
    mapping in many packets (a compiled step's group program) computes it once and passes it
    to :func:`encode_task`; the mapping must not change after."""
    return canonical(_attrs(dict(attrs))).decode() if attrs else "{}"


def _task_body_checked(p: TaskPacket, known_attrs: str | None = None) -> bytes | None:
    """``canonical(task_to_wire(p))`` if cheap checks prove ``task_from_wire`` accepts it,
    else None. ``known_attrs``: :func:`attrs_text` of ``p.attrs``."""
    try:
        task, op, inputs, outputs, deadline, src, attrs, to, t, data = p
        if type(src) is not dict:
            if type(src) is not MappingProxyType:
                return None
            src = dict(src)
        if type(attrs) is not dict:
            if type(attrs) is not MappingProxyType:
                return None
            attrs = dict(attrs)
        if type(task) is not str or _task_id_match(task) is None:
            return None
        if type(inputs) is not tuple or type(outputs) is not tuple:
            return None
        ids = [to, op, *inputs, *outputs, *src.values()]
        joined = " ".join(ids)  # one regex for every id, as task_from_wire's fast accept
        if joined.count(" ") != len(ids) - 1 or _ids_match(joined) is None:
            return None
        if len(outputs) > 1 and len(set(outputs)) != len(outputs):
            return None
        for tile in src:
            if tile not in inputs:
                return None
        dl, tt = _float_text(deadline), _float_text(t)
        if dl is None or tt is None:
            return None
        if attrs and known_attrs is None:
            _value(attrs, 0)
        carried = _carried_text(data, inputs, src) if data else ""
    except (TypeError, ValueError, _BadValue):
        return None
    if carried is None:
        return None
    # Ids hold nothing to escape; str.join and + copy their characters as the regex saw them.
    text = known_attrs if known_attrs is not None else canonical(attrs).decode() if attrs else "{}"
    pairs = ",".join(['"' + k + '":"' + src[k] + '"' for k in sorted(src)])
    ins = '"' + '","'.join(inputs) + '"' if inputs else ""
    outs = '"' + '","'.join(outputs) + '"' if outputs else ""
    return ('{"attrs":' + text + carried + ',"deadline":' + dl + ',"from":{' + pairs + '},"in":[' + ins
            + '],"op":"' + op + '","out":[' + outs + '],"t":' + tt + ',"task":"' + task + '","to":"' + to
            + '","v":' + _V + "}").encode()


def _carried_text(data: Any, inputs: tuple[str, ...], src: dict[str, str]) -> str | None:
    """``,"data":{...}`` for carried values ``task_from_wire`` accepts (the ids are checked
    with the others: every key is an input), else None. Base64 needs no escaping."""
    members = []
    total = 0
    for tile in sorted(data):
        c = data[tile]
        if tile not in inputs or tile in src:
            return None
        shape, dtype, raw = c
        if (type(shape) is not tuple or len(shape) > MAX_RANK or type(dtype) is not str
                or dtype not in dt.BY_NAME or type(raw) is not bytes):
            return None
        for n in shape:
            if type(n) is not int or not 0 <= n <= CARRY_MAX_BYTES:
                return None
        total += len(raw)
        if len(raw) != math.prod(shape) * dt.BY_NAME[dtype].itemsize or total > CARRY_MAX_BYTES:
            return None
        members.append('"' + tile + '":{"b64":"' + base64.b64encode(raw).decode() + '","dtype":"' + dtype
                       + '","shape":[' + ",".join(map(int.__repr__, shape)) + "]}")
    return ',"data":{' + ",".join(members) + "}"


def _reply_body_checked(r: Reply) -> bytes | None:
    """``canonical(reply_to_wire(r))`` for a successful reply that cheap checks prove
    ``reply_from_wire`` accepts, else None (error replies take the general path)."""
    try:
        task, ok, timings, outputs, error, data = r
        if ok is not True or error is not None or type(outputs) is not tuple or data:
            return None
        if type(task) is not str or _task_id_match(task) is None:
            return None
        q, start, end = timings
        tq, ts, te = _float_text(q), _float_text(start), _float_text(end)
        if tq is None or ts is None or te is None:
            return None
        outs = []
        for o in outputs:
            tile, shape, dtype, nbytes = o
            if (type(tile) is not str or _id_match(tile) is None or type(dtype) is not str
                    or _dtype_match(dtype) is None or type(nbytes) is not int
                    or not 0 <= nbytes <= _INT64[1] or type(shape) is not tuple):
                return None
            for n in shape:
                if type(n) is not int or not 0 <= n <= _INT64[1]:
                    return None
            outs.append('{"bytes":' + int.__repr__(nbytes) + ',"dtype":"' + dtype + '","shape":['
                        + ",".join(map(int.__repr__, shape)) + '],"tile":"' + tile + '"}')
    except (TypeError, ValueError):
        return None
    return ('{"error":null,"ok":true,"outputs":[' + ",".join(outs) + '],"task":"' + task
            + '","timings":{"end":' + te + ',"queued":' + tq + ',"start":' + ts + '},"v":' + _V
            + "}").encode()


def _seal(wire: dict[str, Any] | None, secret: bytes, body: bytes | None = None) -> bytes:
    if body is None:
        body = canonical(wire)
    out = b"%s,\"sig\":\"%s\"}" % (body[:-1], sign(body, secret).encode("ascii"))
    if len(out) > MAX_FRAME_BYTES:
        raise PacketTooLarge(f"encoded packet is {len(out)} bytes; the bound is {MAX_FRAME_BYTES}")
    return out


# --- parsing -------------------------------------------------------------------------

_YamlBase: Any = SafeLoader


class _StrictLoader(_YamlBase):  # type: ignore[misc,valid-type]
    """The safe loader, refusing duplicate and merge (``<<``) keys."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(None, None, "merge keys are not allowed",
                                                        key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)) or key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PacketMalformed(f"packet is not UTF-8: {e.reason} at byte {e.start}") from None
    try:
        return bounded_load(text, max_depth=MAX_DEPTH, loader=_StrictLoader)
    except YamlRefused as e:
        raise PacketMalformed(f"packet {e}") from None
    except PacketError:
        raise
    except Exception as e:  # PyYAML raises YAMLError, but also ValueError (bad timestamps) etc.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PacketMalformed(f"packet is not YAML: {first}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse(data: bytes) -> tuple[Any, bool]:
    """(value, whether it came through the JSON fast path)."""
    if data[:1] == b"{":
        try:
            if _json_loads is not None:
                return _json_loads(data), True
            return json.loads(data, parse_constant=_reject_constant), True
        except (ValueError, RecursionError):
            pass  # flow-style YAML that is not JSON, or garbage: the YAML loader decides
    return _load_yaml(data), False


# --- encode / decode -----------------------------------------------------------------


def encode_task(p: TaskPacket, secret: bytes, *, known_attrs: str | None = None) -> bytes:
    """The canonical signed bytes of ``p``. Raises ``PacketInvalid`` if the decoder would
    refuse ``p`` and ``PacketTooLarge`` above ``MAX_FRAME_BYTES``; a result of at most
    ``MAX_DATAGRAM_BYTES`` may go as one UDP datagram, a larger one must go framed over TCP.
    ``known_attrs``: :func:`attrs_text` of ``p.attrs``, computed earlier (not checked again)."""
    body = _task_body_checked(p, known_attrs)
    if body is None:  # not provably valid by the cheap check: the decoder's own check explains
        wire = task_to_wire(p)
        task_from_wire(wire)
        body = canonical(wire) if "data" in wire else _task_body(wire)  # (refused values: explained)
    return _seal(None, secret, body)


def encode_reply(r: Reply, secret: bytes) -> bytes:
    """As ``encode_task``, for a reply."""
    body = _reply_body_checked(r)
    if body is None:
        wire = reply_to_wire(r)
        reply_from_wire(wire)
        body = canonical(wire)
    return _seal(None, secret, body)


def encode_control(c: Control, secret: bytes) -> bytes:
    """As ``encode_task``, for a control message."""
    wire = control_to_wire(c)
    control_from_wire(wire)
    return _seal(wire, secret)


def encode(m: Message, secret: bytes) -> bytes:
    """Encode any message (dispatches on its type)."""
    if isinstance(m, TaskPacket):
        return encode_task(m, secret)
    if isinstance(m, Reply):
        return encode_reply(m, secret)
    if isinstance(m, Control):
        return encode_control(m, secret)
    raise TypeError(f"cannot encode {type(m).__name__} as a packet")


_SIG_HEAD = b',"sig":"'
_SIG_BYTES = re.compile(rb"[0-9a-f]{64}")


def _signature(data: bytes, secret: bytes) -> bytes:
    """``sign(data[:-74] + b"}", secret)`` as ASCII bytes, without copying ``data``."""
    inner_pad, outer_pad = _pads(secret)
    inner = inner_pad.copy()
    inner.update(memoryview(data)[:-74])
    inner.update(b"}")
    outer = outer_pad.copy()
    outer.update(inner.digest())
    return outer.hexdigest().encode("ascii")


def _open(data: bytes, max_bytes: int, secret: bytes) -> dict[str, Any]:
    """Size, signature, then parse, mapping and version: the fields without ``sig``.

    The signature is checked over the raw bytes before anything is parsed, so what a
    stranger sends costs a length check and at most one HMAC, never a parse."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"packet data must be bytes, got {type(data).__name__}")
    if not 0 < max_bytes <= MAX_FRAME_BYTES:
        raise ValueError(f"max_bytes must be in 1..{MAX_FRAME_BYTES}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise PacketTooLarge(f"packet is {len(data)} bytes; the bound here is {max_bytes}")
    if not data:
        raise PacketMalformed("empty packet")
    if data[-74:-66] != _SIG_HEAD or data[-2:] != b'"}':
        raise PacketSignatureError("packet is unsigned (it does not end with its 'sig' member)",
                                   reason="unsigned")
    sig = data[-66:-2]
    if _SIG_BYTES.fullmatch(sig) is None:
        raise PacketSignatureError("'sig' is not 64 lowercase hex digits", reason="bad_signature")
    if not hmac.compare_digest(_signature(data, secret), sig):
        raise PacketSignatureError("signature does not match (wrong secret or altered packet)",
                                   reason="bad_signature")
    d, _ = _parse(data)  # authenticated bytes: only a holder of the secret gets here
    if type(d) is not dict:
        raise PacketMalformed(f"packet is not a mapping but {type(d).__name__}")
    if "v" not in d:
        invalid_field("v", "missing (the packet version)")
    v = d["v"]
    if type(v) is not int:
        invalid_field("v", f"expected an integer version, got {v!r:.40}")
    if v != VERSION:
        raise PacketVersionError(f"packet version {v} is not supported (this codec speaks {VERSION})")
    if d.pop("sig", None) != sig.decode("ascii"):
        raise PacketMalformed("'sig' is not the packet's last member")
    return d


def _check_task_time(p: TaskPacket, now: float, grace: float, max_ahead: float, max_age: float) -> None:
    if now > p.deadline + grace:
        raise PacketStale(f"task {p.task} is {now - p.deadline:.3f} s past its deadline")
    if p.deadline > now + max_ahead:
        raise PacketStale(f"task {p.task} has a deadline {p.deadline - now:.0f} s ahead "
                          f"(at most {max_ahead:.0f} s allowed)")
    if abs(now - p.t) > max_age:
        raise PacketStale(f"task {p.task} was sent {now - p.t:.3f} s from now (bound {max_age} s)")


def decode_task(data: bytes, secret: bytes, *, now: float | None = None,
                max_bytes: int = MAX_DATAGRAM_BYTES, grace: float = DEFAULT_GRACE,
                max_ahead: float = DEFAULT_MAX_AHEAD, max_age: float = DEFAULT_MAX_AGE) -> TaskPacket:
    """Check and decode a task packet (order: size, signature, syntax, version, schema,
    time). Stale means ``now > deadline + grace``, ``deadline > now + max_ahead`` or
    ``|now - t| > max_age``; ``now`` defaults to ``time.time()``. Raises only
    ``PacketError`` for bad bytes (``TypeError``/``ValueError`` for bad arguments)."""
    p = task_from_wire(_open(data, max_bytes, secret))
    _check_task_time(p, time.time() if now is None else now, grace, max_ahead, max_age)
    return p


def decode_reply(data: bytes, secret: bytes, *, max_bytes: int = MAX_DATAGRAM_BYTES) -> Reply:
    """Check and decode a reply. Replies carry no staleness window: the scheduler records a
    task's result once (dedup by task id) and ignores replies for settled attempts."""
    return reply_from_wire(_open(data, max_bytes, secret))


def decode_control(data: bytes, secret: bytes, *, now: float | None = None,
                   max_bytes: int = MAX_DATAGRAM_BYTES, max_age: float = DEFAULT_MAX_AGE) -> Control:
    """Check and decode a control message; stale when ``|now - t| > max_age``."""
    c = control_from_wire(_open(data, max_bytes, secret))
    now = time.time() if now is None else now
    if abs(now - c.t) > max_age:
        raise PacketStale(f"{c.kind} {c.id} sent {now - c.t:.3f} s from now (bound {max_age} s)")
    return c


def decode(data: bytes, secret: bytes, *, now: float | None = None,
           max_bytes: int = MAX_DATAGRAM_BYTES, grace: float = DEFAULT_GRACE,
           max_ahead: float = DEFAULT_MAX_AHEAD, max_age: float = DEFAULT_MAX_AGE) -> Message:
    """Decode any message: a control message has ``kind``, a reply has ``ok``, else a task."""
    d = _open(data, max_bytes, secret)
    now = time.time() if now is None else now
    if "kind" in d:
        c = control_from_wire(d)
        if abs(now - c.t) > max_age:
            raise PacketStale(f"{c.kind} {c.id} sent {now - c.t:.3f} s from now (bound {max_age} s)")
        return c
    if "ok" in d:
        return reply_from_wire(d)
    p = task_from_wire(d)
    _check_task_time(p, now, grace, max_ahead, max_age)
    return p
