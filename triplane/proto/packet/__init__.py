"""The task packet codec: signed, size-bounded YAML messages between scheduler and executors.

The schema, the canonical form and golden examples are fixed in ``proto/packet.md``; this
package is its Python implementation (``schema``: messages and validation; ``codec``:
canonical form, signature, parsing, encode/decode; ``transport``: TCP framing, drop
counters, replay memory). Three message kinds share one envelope:

* a **task** (scheduler -> executor): ``TaskPacket``;
* a **reply** (executor -> scheduler): ``Reply``;
* a **control** message (either way): ``Control`` -- ``ping``/``pong`` and ``ack``.

Wire form. ``encode_*`` writes the *canonical form*: JSON with sorted keys, no whitespace,
UTF-8, strings always double-quoted, floats always with a ``.`` and a signed exponent when
they have one -- a subset of YAML that ``yaml.safe_load`` reads to the same values -- with
``"sig"`` appended as the last key. ``sig`` is the HMAC-SHA256 (lowercase hex) of the
canonical form of every other field, keyed with the cluster secret.

Decoding checks the signature first, over the raw bytes: the packet must end with its
``,"sig":"<hex>"}`` member and the HMAC of the bytes before it (plus ``}``) must match.
Only then is it parsed (JSON fast path via orjson or the stdlib, then the safe C YAML
loader) and checked against the schema. So unauthenticated bytes cost a length check and
at most one HMAC, never a parse, and a packet is read exactly as its signer wrote it.
Executors hold one ``ReplayGuard`` (drop duplicate task ids) and one ``DropCounters``.

Errors. Every rejection of received bytes raises a ``PacketError`` and nothing else::

    TriplaneError
    └── PacketError             reason = the DropCounters field it counts under
        ├── PacketTooLarge      "oversized": over the datagram or frame bound
        ├── PacketMalformed     "malformed": not UTF-8, not YAML/JSON, too deep, aliases,
        │                        duplicate keys, not a mapping, bad frame (after the signature)
        ├── PacketInvalid       "invalid": a field is missing, unknown or ill-typed (``.field``)
        ├── PacketVersionError  "version": ``v`` is not a version this codec speaks
        ├── PacketSignatureError "unsigned" or "bad_signature"
        └── PacketStale         "stale": past its deadline (+ grace), or out of its time window

Programming errors on the sending side (a secret shorter than 16 bytes, data that is not
bytes) raise ``ValueError``/``TypeError``; ``encode_*`` raises ``PacketInvalid`` for a
message the decoder would refuse, so nothing is sent that the other end must drop.
"""

from triplane.proto.packet.codec import (
    attrs_text,
    canonical,
    decode,
    decode_control,
    decode_reply,
    decode_task,
    encode,
    encode_control,
    encode_reply,
    encode_task,
    sign,
)
from triplane.proto.packet.errors import (
    PacketError,
    PacketInvalid,
    PacketMalformed,
    PacketSignatureError,
    PacketStale,
    PacketTooLarge,
    PacketVersionError,
)
from triplane.proto.packet.schema import (
    CARRY_MAX_BYTES,
    DEFAULT_GRACE,
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_AHEAD,
    MAX_DATAGRAM_BYTES,
    MAX_FRAME_BYTES,
    REPLY_CARRY_MAX_BYTES,
    VERSION,
    Carried,
    Control,
    Message,
    Reply,
    TaskError,
    TaskPacket,
    TileInfo,
    Timings,
    parse_task_id,
)
from triplane.proto.packet.transport import DropCounters, FrameBuffer, ReplayGuard, frame, read_frame

__all__ = [
    "CARRY_MAX_BYTES", "Carried", "DEFAULT_GRACE", "DEFAULT_MAX_AGE", "DEFAULT_MAX_AHEAD",
    "MAX_DATAGRAM_BYTES", "MAX_FRAME_BYTES", "REPLY_CARRY_MAX_BYTES",
    "VERSION", "Control", "DropCounters", "FrameBuffer", "Message", "PacketError", "PacketInvalid",
    "PacketMalformed", "PacketSignatureError", "PacketStale", "PacketTooLarge", "PacketVersionError",
    "ReplayGuard", "Reply", "TaskError", "TaskPacket", "TileInfo", "Timings", "attrs_text", "canonical",
    "decode", "decode_control", "decode_reply", "decode_task", "encode", "encode_control", "encode_reply",
    "encode_task", "frame", "parse_task_id", "read_frame", "sign",
]
