"""Typed records: keys, canonical JSON, strict decoding; URL parsing of connect_registry."""

from __future__ import annotations

import json

import pytest

from triplane.registry import (
    Binding,
    MemoryBackend,
    MemoryEngineInfo,
    NetworkEngineInfo,
    NodeInfo,
    OpEngineInfo,
    RecordError,
    connect_registry,
    known_schemes,
)
from triplane.registry.records import decode, encode
from triplane.registry.testing import run, sample_node

RECORDS = [
    sample_node("n1"),
    OpEngineInfo("n1", "numpy", "numpy", "cpu", ("add", "matmul"), ("float32", "float64"), 55.5, 7.25),
    MemoryEngineInfo("n1", "host", "host", 8 << 30, 3 << 30),
    NetworkEngineInfo("n1", "udp", "udp", 1.25, 190.0),
    Binding("n1", "numpy", "host"),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_records_roundtrip_through_canonical_json(record: object) -> None:
    raw = encode(record)  # type: ignore[arg-type]
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert decode(type(record), raw, key=record.key()) == record  # type: ignore[attr-defined]


def test_keys_follow_the_architecture_layout() -> None:
    assert [r.key() for r in RECORDS] == [
        "nodes/n1", "engines/op/n1/numpy", "engines/memory/n1/host", "engines/network/n1/udp",
        "bindings/n1/numpy"]


@pytest.mark.parametrize("raw, message", [
    (b"{", "Expecting"),
    (b"\xff", "codec"),
    (b"[]", "JSON object"),
    (b'{"node": "n1"}', "missing field"),
])
def test_malformed_values_raise_record_error_naming_the_key(raw: bytes, message: str) -> None:
    with pytest.raises(RecordError, match=message) as info:
        decode(NodeInfo, raw, key="nodes/n1")
    assert "nodes/n1" in str(info.value)


def test_field_types_are_checked() -> None:
    good = json.loads(encode(sample_node("n1")))
    bad_fields = (("pid", "12"), ("pid", True), ("udp_port", 1.5), ("started_at", "now"), ("address", 1))
    for field, bad in bad_fields:
        with pytest.raises(RecordError, match=field):
            decode(NodeInfo, json.dumps({**good, field: bad}).encode(), key="nodes/n1")
    ops = json.loads(encode(RECORDS[1]))
    with pytest.raises(RecordError, match="list of str"):
        decode(OpEngineInfo, json.dumps({**ops, "ops": "add"}).encode(), key="engines/op/n1/numpy")
    # A newer writer's extra field is tolerated.
    assert decode(NodeInfo, json.dumps({**good, "zone": "a"}).encode(), key="nodes/n1") == sample_node("n1")


def test_a_field_added_with_a_default_may_be_missing_from_an_older_record() -> None:
    good = json.loads(encode(sample_node("n1")))
    assert good["cpus"] == sample_node("n1").cpus
    older = {k: v for k, v in good.items() if k != "cpus"}
    assert decode(NodeInfo, json.dumps(older).encode(), key="nodes/n1").cpus == 0
    with pytest.raises(RecordError, match="missing field 'pid'"):  # no default: still required
        decode(NodeInfo, json.dumps({k: v for k, v in good.items() if k != "pid"}).encode(), key="nodes/n1")
    with pytest.raises(RecordError, match="cpus"):
        decode(NodeInfo, json.dumps({**good, "cpus": "two"}).encode(), key="nodes/n1")


def test_record_under_the_wrong_key_is_rejected() -> None:
    with pytest.raises(RecordError, match="belong under 'nodes/n1'"):
        decode(NodeInfo, encode(sample_node("n1")), key="nodes/n2")


@pytest.mark.parametrize("name", ["", "a/b", "..", "x\x00"])
def test_bad_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError):
        encode(sample_node(name))


def test_nan_figures_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        encode(OpEngineInfo("n1", "e", "numpy", "cpu", (), (), float("nan"), 1.0))


def test_connect_registry_memory_urls() -> None:
    assert isinstance(connect_registry("memory://"), MemoryBackend)
    a, b = connect_registry("memory://shared-test"), connect_registry("memory://shared-test")
    assert isinstance(a, MemoryBackend) and isinstance(b, MemoryBackend) and a.store is b.store
    assert connect_registry("memory://").store is not connect_registry("memory://").store  # type: ignore[attr-defined]

    async def body() -> bytes | None:
        await a.put("k", b"shared")
        got = await b.get("k")
        return None if got is None else got.value
    assert run(body(), timeout_s=5) == b"shared"
    assert connect_registry("memory://", prefix="/x/").prefix == "/x/"


def test_connect_registry_etcd_urls() -> None:
    pytest.importorskip("aetcd", reason="the etcd backend needs 'aetcd' (pip install aetcd)")
    from triplane.registry.etcd import EtcdBackend

    r = connect_registry("etcd://127.0.0.1:23790")
    assert isinstance(r, EtcdBackend) and (r.host, r.port, r.prefix) == ("127.0.0.1", 23790, "/triplane/")
    r = connect_registry("etcd://db.local/prod/triplane")
    assert isinstance(r, EtcdBackend) and (r.port, r.prefix) == (2379, "/prod/triplane/")


@pytest.mark.parametrize("url, message", [
    ("redis://x", "known schemes: \\['etcd', 'http', 'https', 'memory'"),
    ("127.0.0.1:2379", "SCHEME://"),
    ("etcd://127.0.0.1:notaport", "bad port"),
    ("etcd://:2379", "names no host"),
])
def test_connect_registry_rejects_bad_urls(url: str, message: str) -> None:
    if url.startswith("etcd"):
        pytest.importorskip("aetcd", reason="the etcd backend needs 'aetcd' (pip install aetcd)")
    with pytest.raises(ValueError, match=message):
        connect_registry(url)
    assert {"etcd", "memory"} <= set(known_schemes())
