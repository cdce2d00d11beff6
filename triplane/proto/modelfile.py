"""The model file: one file holding a graph, its parameters and a manifest, never pickle.

Any SDK can read and write it (it is bytes, JSON and little-endian arrays), so the format
lives here with the rest of the contract; ``triplane/sdk/model.py`` (``tp.save_model`` /
``tp.load_model``) traces and runs what it holds. Layout (all integers little-endian)::

    offset  size  field
    0       8     magic  b"TPMODEL\\0"
    8       4     format version (u32; this module writes and reads FORMAT_VERSION)
    12      4     flags (u32, 0)
    16      8     manifest length M (u64)
    24      8     signature length S (u64; 0 when unsigned)
    32      32    SHA-256 of the manifest bytes
    64      M     manifest: canonical JSON (sorted keys, no whitespace)
    64+M    S     signature: canonical JSON {"alg", "key_id", "value"} over the manifest bytes
    64+M+S  ...   data: the sections the manifest lists, at their offsets from here

The manifest names the sections, each ``{"offset", "length", "sha256"}``: ``graph`` (the
canonical IR JSON of :class:`~triplane.proto.ir.Graph`) and ``params`` (the safetensors
layout: u64 header length N, a JSON header ``{name: {"dtype": "F32", "shape": [...],
"data_offsets": [begin, end]}}``, then the raw little-endian bytes; a ``params`` section
read out of the file is a valid ``.safetensors`` file). ``params.tensors`` lists each
tensor's dtype, shape and SHA-256; ``data_bytes`` is the length of the data area, so a
short file is known to be truncated. The manifest's other fields belong to the writer
(the SDK records ``triplane_version``, ``inputs``, ``outputs`` and ``batch``).
``CONTAINER_KEYS`` are the fields :func:`pack` adds.

The signature covers the manifest bytes, and the manifest holds the SHA-256 of every
section and tensor, so it covers the whole file. ``alg`` is ``hmac-sha256`` (a shared
``bytes``/``str`` key) or ``ed25519`` (the ``cryptography`` package's key objects: sign
with the private key, verify with the public one). ``key_id`` (16 hex digits derived from
the key) tells "signed with another key" (``bad_signature``) from "changed after
signing" (``tampered``). Without a key nothing is verified but the checksums, which catch
accidents (``corrupted``), not someone who rewrites them too: sign a file that crosses a
trust boundary. Every refusal is a :class:`~triplane.proto.errors.ModelFileError` whose
``kind`` says which check failed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto.canonjson import canonical_json
from triplane.proto.errors import ModelFileError

__all__ = ["FORMAT_VERSION", "MAGIC", "decode_params", "encode_params", "key_id", "pack", "read", "write"]

MAGIC = b"TPMODEL\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQ32s")  # 64 bytes
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
CONTAINER_KEYS = frozenset({"format", "format_version", "graph", "params", "data_bytes"})

# safetensors' dtype names <-> triplane's
_ST_DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
              "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8",
              "bool": "BOOL"}
_FROM_ST = {v: k for k, v in _ST_DTYPES.items()}


def _sha(b: bytes | memoryview) -> str:
    return hashlib.sha256(b).hexdigest()


# --- the params section: the safetensors layout ----------------------------------------


def encode_params(params: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, Any]]:
    """The safetensors bytes of ``params`` (sorted by name) and, per tensor, its dtype,
    shape and SHA-256 (of its raw little-endian bytes)."""
    header: dict[str, Any] = {}
    chunks: list[bytes] = []
    listing: dict[str, Any] = {}
    pos = 0
    for name in sorted(params):
        arr = np.asarray(params[name])
        d = dt.dtype(arr.dtype)
        raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _ST_DTYPES[d.name], "shape": list(arr.shape),
                        "data_offsets": [pos, pos + len(raw)]}
        listing[name] = {"dtype": d.name, "shape": list(arr.shape), "sha256": _sha(raw)}
        chunks.append(raw)
        pos += len(raw)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(head)) + head + b"".join(chunks), listing


def decode_params(data: bytes, listing: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
    """Arrays of a params section, each checked against ``listing`` (dtype, shape,
    SHA-256): ``corrupted`` names the first that differs."""
    def bad(msg: str) -> ModelFileError:
        return ModelFileError("corrupted", f"{where} is corrupted: {msg}")

    if len(data) < 8:
        raise bad("the parameter section is shorter than its header")
    (n,) = struct.unpack_from("<Q", data)
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except (ValueError, UnicodeDecodeError):
        raise bad("the parameter section's header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("the parameter section's header is not a mapping")
    header.pop("__metadata__", None)
    if set(header) != set(listing):
        raise bad(f"the parameter section holds {sorted(header)[:8]}, the manifest lists "
                  f"{sorted(listing)[:8]}")
    body = memoryview(data)[8 + n:]
    out: dict[str, np.ndarray] = {}
    for name, entry in listing.items():
        h = header[name]
        try:
            b, e = (int(x) for x in h["data_offsets"])
            d = dt.BY_NAME[_FROM_ST[h["dtype"]]]
            shape = tuple(int(s) for s in h["shape"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"parameter {name!r} has a malformed header entry") from None
        if d.name != entry.get("dtype") or list(shape) != entry.get("shape"):
            raise bad(f"parameter {name!r} is {d.name}{list(shape)} in the section but "
                      f"{entry.get('dtype')}{entry.get('shape')} in the manifest")
        if not 0 <= b <= e <= len(body) or e - b != int(np.prod(shape, dtype=np.int64)) * d.itemsize:
            raise bad(f"parameter {name!r} has data offsets [{b}, {e}] that do not fit")
        raw = body[b:e]
        if _sha(raw) != entry.get("sha256"):
            raise bad(f"parameter {name!r} does not match its SHA-256")
        arr = np.frombuffer(raw, dtype=d.np.newbyteorder("<")).astype(d.np, copy=False).reshape(shape)
        out[name] = arr
    return out


# --- signing ------------------------------------------------------------------------------


def _hmac_key(key: Any) -> bytes | None:
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, (bytes, bytearray)):
        if not key:
            raise ValueError("an HMAC key must not be empty")
        return bytes(key)
    return None


def _ed25519() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519


def _ed_public_raw(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pub = key.public_key() if isinstance(key, _ed25519().Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _alg(key: Any) -> str:
    if _hmac_key(key) is not None:
        return "hmac-sha256"
    ed = _ed25519()
    if isinstance(key, (ed.Ed25519PrivateKey, ed.Ed25519PublicKey)):
        return "ed25519"
    raise TypeError(f"a model file key is bytes or str (HMAC-SHA256) or a cryptography "
                    f"Ed25519PrivateKey/Ed25519PublicKey, not {type(key).__name__}")


def key_id(key: Any) -> str:
    """16 hex digits naming ``key`` (an HMAC key's derivation; an Ed25519 key's public half)."""
    hk = _hmac_key(key)
    if hk is not None:
        return hmac.new(hk, b"triplane.model key-id", hashlib.sha256).hexdigest()[:16]
    _alg(key)
    return hashlib.sha256(_ed_public_raw(key)).hexdigest()[:16]


def _sign(manifest: bytes, key: Any) -> bytes:
    alg = _alg(key)
    if alg == "hmac-sha256":
        value = hmac.new(_hmac_key(key) or b"", manifest, hashlib.sha256).hexdigest()
    else:
        if not isinstance(key, _ed25519().Ed25519PrivateKey):
            raise TypeError("signing with Ed25519 needs the private key (Ed25519PrivateKey)")
        value = key.sign(manifest).hex()
    return canonical_json({"alg": alg, "key_id": key_id(key), "value": value})


def _verify(manifest: bytes, sig: bytes, key: Any, where: str) -> None:
    alg = _alg(key)
    if not sig:
        raise ModelFileError("unsigned", f"{where} is not signed, and a key was given to verify it "
                             "(save it with key=... to sign it)")
    try:
        doc = json.loads(sig)
        salg, skid, value = doc["alg"], doc["key_id"], bytes.fromhex(doc["value"])
    except (ValueError, KeyError, TypeError):
        raise ModelFileError("bad_signature", f"{where} has a malformed signature block") from None
    if salg != alg:
        raise ModelFileError("bad_signature", f"{where} is signed with {salg}, but the key given is "
                             f"an {alg} key")
    if skid != key_id(key):
        raise ModelFileError("bad_signature", f"{where} is signed with another key (key id {skid}; "
                             f"the key given has id {key_id(key)})")
    if alg == "hmac-sha256":
        ok = hmac.compare_digest(value, hmac.new(_hmac_key(key) or b"", manifest, hashlib.sha256).digest())
    else:
        from cryptography.exceptions import InvalidSignature

        pub = key.public_key() if isinstance(key, _ed25519().Ed25519PrivateKey) else key
        try:
            pub.verify(value, manifest)
            ok = True
        except InvalidSignature:
            ok = False
    if not ok:
        raise ModelFileError("tampered", f"{where} was tampered with: its signature (key id {skid}) "
                             "does not match its contents")


# --- the container ------------------------------------------------------------------------


def pack(manifest: Mapping[str, Any], graph_json: bytes, params: Mapping[str, np.ndarray]
         ) -> tuple[dict[str, Any], bytes, bytes]:
    """The manifest as a file holding this graph and these parameters records it (the
    writer's fields plus the format fields, sections and checksums), its bytes, and the
    params section's bytes. Equal inputs give equal bytes."""
    pbytes, listing = encode_params(params)
    doc = dict(manifest)
    doc.update({
        "format": "triplane.model", "format_version": FORMAT_VERSION,
        "graph": {"offset": 0, "length": len(graph_json), "sha256": _sha(graph_json)},
        "params": {"offset": len(graph_json), "length": len(pbytes), "sha256": _sha(pbytes),
                   "tensors": listing},
        "data_bytes": len(graph_json) + len(pbytes),
    })
    mbytes = canonical_json(doc)
    return json.loads(mbytes), mbytes, pbytes


def write(path: str | os.PathLike[str], manifest: Mapping[str, Any], graph_json: bytes,
          params: Mapping[str, np.ndarray], *, key: Any = None) -> tuple[dict[str, Any], bytes]:
    """Write a model file (to a temporary name, then renamed: an interrupted write leaves
    the previous file whole). ``manifest`` holds the writer's fields; :func:`pack` adds
    the rest. Returns the manifest as written and its bytes."""
    if key is not None:
        _alg(key)  # a bad key fails before anything is written
    doc, mbytes, pbytes = pack(manifest, graph_json, params)
    sig = _sign(mbytes, key) if key is not None else b""
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(mbytes), len(sig), hashlib.sha256(mbytes).digest())
    p = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".tp-model-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(p)))
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (head, mbytes, sig, graph_json, pbytes):
                f.write(part)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return doc, mbytes


def read(path: str | os.PathLike[str], *, key: Any = None
         ) -> tuple[dict[str, Any], bytes, dict[str, np.ndarray], bytes]:
    """Read and check a model file: the manifest, the graph JSON bytes, the parameters and
    the manifest's raw bytes. The checks run in this order, each with its own ``kind``:
    magic, version, lengths (``truncated``), manifest checksum, signature (when ``key`` is
    given), sections and tensors (``corrupted``)."""
    p = os.fspath(path)
    where = f"model file {p!r}"
    with open(p, "rb") as f:
        data = f.read()
    if len(data) < _HEADER.size:
        if data and not MAGIC.startswith(data[:8]):
            raise ModelFileError("not_a_model", f"{where} is not a triplane model file")
        raise ModelFileError("truncated", f"{where} is truncated: {len(data)} bytes, shorter than "
                             f"the {_HEADER.size}-byte header")
    magic, version, _flags, mlen, slen, msha = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ModelFileError("not_a_model", f"{where} is not a triplane model file (it starts "
                             f"with {data[:8]!r}, not {MAGIC!r})")
    if version > FORMAT_VERSION:
        raise ModelFileError("unsupported_version", f"{where} is in model format version {version}"
                             f"{_writer(data, mlen)}; this triplane reads version {FORMAT_VERSION} "
                             "and older: upgrade triplane to load it")
    if version < 1:
        raise ModelFileError("corrupted", f"{where} is corrupted: format version {version}")
    if mlen > MAX_MANIFEST_BYTES:
        raise ModelFileError("corrupted", f"{where} is corrupted: a manifest length of {mlen} bytes")
    start = _HEADER.size + mlen + slen
    if len(data) < start:
        raise ModelFileError("truncated", f"{where} is truncated: {len(data)} bytes, but its header "
                             f"records a manifest and signature ending at byte {start}")
    mbytes = data[_HEADER.size:_HEADER.size + mlen]
    if hashlib.sha256(mbytes).digest() != msha:
        raise ModelFileError("corrupted", f"{where} is corrupted: the manifest does not match its "
                             "SHA-256")
    try:
        manifest = json.loads(mbytes)
        total = start + int(manifest["data_bytes"])
        sections = {s: (int(manifest[s]["offset"]), int(manifest[s]["length"]), manifest[s]["sha256"])
                    for s in ("graph", "params")}
        listing = manifest["params"]["tensors"]
    except (ValueError, KeyError, TypeError):
        raise ModelFileError("corrupted", f"{where} is corrupted: its manifest is malformed") from None
    if key is not None:
        _verify(mbytes, data[_HEADER.size + mlen:start], key, where)
    if len(data) < total:
        raise ModelFileError("truncated", f"{where} is truncated: {len(data)} bytes of the "
                             f"{total} its manifest records")
    if len(data) > total:
        raise ModelFileError("corrupted", f"{where} is corrupted: {len(data) - total} bytes follow "
                             "the end its manifest records")
    parts = {}
    for name, (off, length, sha) in sections.items():
        chunk = data[start + off:start + off + length]
        # the tensors are checked one by one first, so a damaged one is named
        params = decode_params(chunk, listing, where) if name == "params" else {}
        if off < 0 or len(chunk) != length or _sha(chunk) != sha:
            raise ModelFileError("corrupted", f"{where} is corrupted: its {name} section does not "
                                 "match its SHA-256")
        parts[name] = chunk
    return manifest, parts["graph"], params, mbytes


def _writer(data: bytes, mlen: int) -> str:
    """`` (written by triplane X)`` when a newer file's manifest still says so."""
    try:
        v = json.loads(data[_HEADER.size:_HEADER.size + mlen]).get("triplane_version")
    except (ValueError, AttributeError):
        return ""
    return f" (written by triplane {v})" if isinstance(v, str) else ""
