"""The model file container: each way a file can be damaged is refused with its own kind
and message, and signatures (HMAC, Ed25519) verify only the file and key they were made with."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from triplane.proto import modelfile
from triplane.proto.errors import ModelFileError, TriplaneError

GRAPH = b'{"nodes":{},"outputs":[],"version":1}'
PARAMS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], np.int64),
          "h": np.ones(3, ml_dtypes.bfloat16), "m": np.array([True, False])}


def _write(tmp_path: Path, key: object = None, name: str = "m.tpm", **manifest: object) -> Path:
    p = tmp_path / name
    modelfile.write(p, {"triplane_version": "0.1.0", **manifest}, GRAPH, PARAMS, key=key)
    return p


def _refused(p: Path, kind: str, key: object = None) -> str:
    with pytest.raises(ModelFileError) as ei:
        modelfile.read(p, key=key)
    assert ei.value.kind == kind, str(ei.value)
    assert isinstance(ei.value, TriplaneError)
    assert str(p) in str(ei.value)
    return str(ei.value)


def test_round_trip_keeps_every_dtype_and_value(tmp_path: Path) -> None:
    manifest, graph, params, _ = modelfile.read(_write(tmp_path, meta=1))
    assert graph == GRAPH and manifest["meta"] == 1 and manifest["format_version"] == 1
    assert sorted(params) == sorted(PARAMS)
    for k, v in PARAMS.items():
        assert params[k].dtype == v.dtype and params[k].shape == v.shape
        np.testing.assert_array_equal(params[k], v)
    assert manifest["params"]["tensors"]["w"]["shape"] == [2, 3]


def test_params_section_is_the_safetensors_layout(tmp_path: Path) -> None:
    data, listing = modelfile.encode_params(PARAMS)
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    b, e = header["w"]["data_offsets"]
    assert header["w"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, b + 24]}
    np.testing.assert_array_equal(np.frombuffer(data[8 + n + b:8 + n + e], "<f4").reshape(2, 3), PARAMS["w"])
    assert n % 8 == 0 and set(listing) == set(PARAMS)


def test_params_section_opens_with_the_safetensors_package(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    plain = {k: v for k, v in PARAMS.items() if k != "h"}  # its numpy reader has no bfloat16
    p = tmp_path / "plain.tpm"
    modelfile.write(p, {}, GRAPH, plain)
    manifest, _, _, _ = modelfile.read(p)
    whole = p.read_bytes()
    mlen, slen = struct.unpack_from("<QQ", whole, 16)
    start = 64 + mlen + slen + manifest["params"]["offset"]
    arrays = st.load(whole[start:start + manifest["params"]["length"]])
    assert sorted(arrays) == sorted(plain)
    for k, v in plain.items():
        assert arrays[k].dtype == v.dtype
        np.testing.assert_array_equal(arrays[k], v)


def test_truncated_files_are_named_truncated(tmp_path: Path) -> None:
    p = _write(tmp_path)
    whole = p.read_bytes()
    for cut in (len(whole) - 1, len(whole) - 40, 70, 63, 10, 0):
        p.write_bytes(whole[:cut])
        assert "truncated" in _refused(p, "truncated")


def test_flipped_bytes_are_named_corrupted_with_the_part(tmp_path: Path) -> None:
    p = _write(tmp_path)
    whole = bytearray(p.read_bytes())
    mlen, slen = struct.unpack_from("<QQ", whole, 16)
    start = 64 + mlen + slen
    flips = {70: "manifest", start + 3: "graph section", len(whole) - 1: "parameter 'w'"}
    for at, part in flips.items():
        bad = bytearray(whole)
        bad[at] ^= 0x40
        p.write_bytes(bytes(bad))
        msg = _refused(p, "corrupted")
        assert part in msg and "corrupted" in msg
    p.write_bytes(bytes(whole) + b"\0")
    assert "follow the end" in _refused(p, "corrupted")


def test_newer_format_version_is_refused_with_both_versions(tmp_path: Path) -> None:
    p = _write(tmp_path)
    whole = bytearray(p.read_bytes())
    struct.pack_into("<I", whole, 8, 7)
    p.write_bytes(bytes(whole))
    msg = _refused(p, "unsupported_version")
    assert "version 7" in msg and "reads version 1" in msg and "triplane 0.1.0" in msg


def test_other_files_are_not_models(tmp_path: Path) -> None:
    p = tmp_path / "x.npz"
    np.savez(p, a=np.ones(3))
    assert "not a triplane model file" in _refused(p, "not_a_model")


def test_hmac_signature_verifies_and_tells_wrong_key_from_tampering(tmp_path: Path) -> None:
    p = _write(tmp_path, key=b"k" * 32)
    modelfile.read(p, key=b"k" * 32)
    modelfile.read(p)  # no key: nothing to verify, checksums still hold
    assert "another key" in _refused(p, "bad_signature", key=b"other key")
    # rewrite a tensor AND its checksums, as someone who knows the format would
    _, graph, params, _ = modelfile.read(p)
    params["w"] = params["w"] * 0
    sig = p.read_bytes()
    mlen, slen = struct.unpack_from("<QQ", sig, 16)
    signature = sig[64 + mlen:64 + mlen + slen]
    forged = tmp_path / "forged.tpm"
    modelfile.write(forged, {"triplane_version": "0.1.0"}, graph, params)
    f = bytearray(forged.read_bytes())
    fm = struct.unpack_from("<Q", f, 16)[0]
    struct.pack_into("<Q", f, 24, len(signature))
    f[64 + fm:64 + fm] = signature  # the old signature grafted on
    forged.write_bytes(bytes(f))
    modelfile.read(forged)  # consistent checksums: without a key this cannot be told
    assert "tampered" in _refused(forged, "tampered", key=b"k" * 32)
    unsigned = _write(tmp_path, key=None, name="unsigned.tpm")
    assert "not signed" in _refused(unsigned, "unsigned", key=b"k" * 32)


def test_ed25519_signature(tmp_path: Path) -> None:
    priv = Ed25519PrivateKey.generate()
    p = _write(tmp_path, key=priv)
    modelfile.read(p, key=priv.public_key())
    assert "another key" in _refused(p, "bad_signature", key=Ed25519PrivateKey.generate().public_key())
    assert "ed25519" in _refused(p, "bad_signature", key=b"an hmac key")
    whole = bytearray(p.read_bytes())
    mlen = struct.unpack_from("<Q", whole, 16)[0]
    doc = json.loads(whole[64:64 + mlen])
    doc["triplane_version"] = "9.9.9"  # an edited manifest with its header checksum fixed
    new = modelfile.canonical_json(doc)
    import hashlib

    whole[64:64 + mlen] = new
    struct.pack_into("<Q", whole, 16, len(new))
    whole[32:64] = hashlib.sha256(new).digest()
    p.write_bytes(bytes(whole))
    assert "tampered" in _refused(p, "tampered", key=priv.public_key())


def test_bad_keys_fail_before_writing(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="Ed25519PrivateKey"):
        _write(tmp_path, key=12)
    with pytest.raises(TypeError, match="private key"):
        _write(tmp_path, key=Ed25519PrivateKey.generate().public_key())
    assert not list(tmp_path.iterdir())
