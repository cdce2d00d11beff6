"""Memory sizes and the cluster secret, as the executor CLI reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from triplane.executor.config import format_size, load_secret, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("768MiB", 768 * 2**20), ("8GiB", 8 * 2**30), ("1.5G", 1_500_000_000), ("4096", 4096),
    ("64mib", 64 * 2**20), ("2 KiB", 2048), ("1k", 1000), ("10B", 10), (".5GiB", 2**29), ("1Ti", 2**40),
])
def test_parse_size_accepts_binary_and_decimal_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12XB", "-1GiB", "1e9", "0", "0.1", "1.2.3G", "8 GiB extra"])
def test_parse_size_refuses_with_a_message_naming_the_input(text: str) -> None:
    with pytest.raises(ValueError, match="memory size") as err:
        parse_size(text)
    assert repr(text) in str(err.value)


def test_format_size() -> None:
    assert format_size(768 * 2**20) == "768.0 MiB"
    assert format_size(12) == "12 B"


def test_secret_from_file_then_environment(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(b"  file-secret-0123456789\n")
    assert load_secret(f, env={"TRIPLANE_SECRET": "env-secret-0123456789"}) == b"file-secret-0123456789"
    assert load_secret(None, env={"TRIPLANE_SECRET": "env-secret-0123456789"}) == b"env-secret-0123456789"


def test_secret_missing_short_or_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no cluster secret"):
        load_secret(None, env={})
    with pytest.raises(ValueError, match="at least 16"):
        load_secret(None, env={"TRIPLANE_SECRET": "short"})
    with pytest.raises(ValueError, match="cannot read the secret file"):
        load_secret(tmp_path / "absent", env={})


def test_memory_engine_specs_name_an_engine_or_a_spilling_pair(tmp_path) -> None:
    from triplane.executor.config import parse_memory_engine

    assert parse_memory_engine("host", 1000) == ("host", 1000, {})
    assert parse_memory_engine(f"file:{tmp_path}", 1000) == ("file", 1000, {"path": str(tmp_path)})
    assert parse_memory_engine("redis://127.0.0.1:6379/0", 10) == ("redis", 10, {"url": "redis://127.0.0.1:6379/0"})
    name, cap, opts = parse_memory_engine(f"host, file:{tmp_path / 's'}@4KiB", 1000)
    assert (name, cap) == ("spill", 1000 + 4096)
    assert opts == {"memory": 1000, "path": str(tmp_path / "s"), "primary": "host"}
    assert (tmp_path / "s").is_dir()
    with pytest.raises(ValueError, match="host,file:DIR"):
        parse_memory_engine("host,redis://x", 1000)
    with pytest.raises(ValueError, match="needs a directory"):
        parse_memory_engine("host,file:", 1000)


def test_the_executor_refuses_a_bad_memory_engine_or_persist_spec_with_status_2(monkeypatch, capsys) -> None:
    from triplane.executor.cli import run_executor

    monkeypatch.setenv("TRIPLANE_SECRET", "s" * 32)
    assert run_executor("memory://", memory_engine="host,redis://x") == 2
    assert "host,file:DIR" in capsys.readouterr().err
    assert run_executor("memory://", memory_engine="nvme") == 2
    assert "unknown memory engine 'nvme'" in capsys.readouterr().err
    assert run_executor("memory://", persist_to="s3://bucket") == 2
    assert "bad persistence target 's3://bucket'" in capsys.readouterr().err
