"""How the file and redis memory engines lay a tile out as bytes, checksummed.

``MAGIC`` (4 bytes), the header's length (4 bytes, little-endian), the header (canonical
JSON: ``key``, ``dtype``, ``shape``, ``sha256`` of the data) and the data (C order). A
tile read back is checked against its header: a wrong magic, a short or long body or a
checksum that does not match raises :class:`~triplane.engines.errors.CorruptTileError`.
"""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np

from triplane.engines.errors import CorruptTileError

__all__ = ["MAGIC", "data_bytes", "decode", "encode_header", "nbytes_of"]

MAGIC = b"TPT1"


def data_bytes(arr: np.ndarray) -> memoryview:
    """``arr``'s data (C-contiguous) as bytes, without a copy."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def encode_header(key: str, arr: np.ndarray) -> bytes:
    """The bytes that go before ``arr``'s data (``arr`` C-contiguous)."""
    digest = hashlib.sha256(data_bytes(arr)).hexdigest()
    head = json.dumps({"key": key, "dtype": arr.dtype.str, "shape": list(arr.shape), "sha256": digest},
                      sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(head)) + head


def decode(blob: bytes, where: str) -> tuple[str, np.ndarray]:
    """(key, read-only array) from a stored blob; CorruptTileError naming ``where``."""
    if len(blob) < 8 or blob[:4] != MAGIC:
        raise CorruptTileError(f"corrupt tile at {where}: not a tile (bad magic)")
    (n,) = struct.unpack_from("<I", blob, 4)
    try:
        head = json.loads(blob[8:8 + n])
        dtype = np.dtype(head["dtype"])
        shape = tuple(int(d) for d in head["shape"])
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptTileError(f"corrupt tile at {where}: bad header ({e})") from None
    data = memoryview(blob)[8 + n:]
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != want:
        raise CorruptTileError(f"corrupt tile {head.get('key')!r} at {where}: {len(data)} data bytes, "
                               f"its header says {want}")
    if hashlib.sha256(data).hexdigest() != head.get("sha256"):
        raise CorruptTileError(f"corrupt tile {head.get('key')!r} at {where}: checksum mismatch")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    return str(head["key"]), arr


def nbytes_of(blob_head: bytes) -> int | None:
    """The data bytes a blob's header declares (None if it is not a tile header)."""
    if len(blob_head) < 8 or blob_head[:4] != MAGIC:
        return None
    (n,) = struct.unpack_from("<I", blob_head, 4)
    try:
        head = json.loads(blob_head[8:8 + n])
        return int(np.prod(head["shape"], dtype=np.int64)) * np.dtype(head["dtype"]).itemsize
    except (ValueError, KeyError, TypeError):
        return None
