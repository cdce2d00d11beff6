"""``python -m triplane.engines.testing --engine NAME`` on memory and network engines: a
pass/fail table per check and the exit status, on host, file, a real redis-server, tcp
and udp, and on deliberately broken plugins (found through entry points) that it names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_sites import ROOT, write_bad_plugins

from triplane.engines.memory.redis_engine import RedisMemoryEngine
from triplane.engines.testing import main

MEMORY_CHECKS = ("protocol", "tiles", "accounting", "capacity", "cache entries", "concurrency",
                 "reopen/persistence")
NETWORK_CHECKS = ("protocol", "frames intact", "32 in flight", "loss+reordering", "no reply fails",
                  "oversize refused", "pair probe")


def _results(out: str) -> dict[str, list[str]]:
    """check -> [result, detail words...] from the kit's table."""
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():
        for name in (*MEMORY_CHECKS, *NETWORK_CHECKS, "made"):
            if line.startswith(name + " ") and line[len(name):].split()[:1] in (["pass"], ["FAIL"], ["skip"]):
                words = line[len(name):].split()
                rows[name] = [words[0], *words[2:]]
    return rows


def _kit(*args: str, site: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "triplane.engines.testing", *args], capture_output=True,
                          text=True, env=env, timeout=180)


@pytest.mark.parametrize(("engine", "persistent"), [("host", False), ("file", True)])
def test_memory_kit_passes_the_built_ins(engine: str, persistent: bool,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine", engine]) == 0
    out = capsys.readouterr().out
    assert f"conformance of memory engine '{engine}'" in out
    rows = _results(out)
    assert set(rows) == set(MEMORY_CHECKS), out
    assert all(rows[c][0] == "pass" for c in MEMORY_CHECKS if c != "reopen/persistence"), out
    assert rows["reopen/persistence"][0] == ("pass" if persistent else "skip"), out


def test_memory_kit_on_a_real_redis_leaves_no_key_behind(redis_url: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine", "redis", "--option", f"url={redis_url}", "--option", "prefix=kit"]) == 0
    rows = _results(capsys.readouterr().out)
    assert all(rows[c][0] == "pass" for c in MEMORY_CHECKS), rows
    assert RedisMemoryEngine(1 << 20, url=redis_url).client.keys("kit-*") == []
    assert main(["--engine", "redis", "--option", "url"]) == 2
    assert "bad --option 'url': expected KEY=VALUE" in capsys.readouterr().out


@pytest.mark.parametrize("engine", ["tcp", "udp"])
def test_network_kit_passes_the_built_ins(engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine", engine]) == 0
    out = capsys.readouterr().out
    rows = _results(out)
    assert f"conformance of network engine '{engine}'" in out
    assert {c: r[0] for c, r in rows.items()} == dict.fromkeys(NETWORK_CHECKS, "pass"), out


def test_broken_plugins_fail_the_kit_which_names_what_is_wrong(tmp_path: Path) -> None:
    site = write_bad_plugins(tmp_path / "bad")
    liar = _kit("--engine", "liar", site=site)  # claims twice its capacity
    assert liar.returncode == 1, liar.stdout + liar.stderr
    rows = _results(liar.stdout)
    assert "conformance of memory engine 'liar'" in liar.stdout
    assert rows["accounting"][0] == rows["tiles"][0] == rows["concurrency"][0] == "FAIL"
    assert rows["capacity"][0] == "pass"  # it still refuses what does not fit
    assert ("put_get_delete: AssertionError at `assert m.used() == 400 and m.capacity() == 1000 and "
            "m.free() == 600`") in liar.stdout
    assert " failed" in liar.stdout.splitlines()[-1] and " 0 failed" not in liar.stdout.splitlines()[-1]

    garbler = _kit("--engine", "garbler", site=site)  # cuts the last byte of each reply
    assert garbler.returncode == 1, garbler.stdout + garbler.stderr
    rows = _results(garbler.stdout)
    assert rows["frames intact"][0] == rows["loss+reordering"][0] == "FAIL"
    assert "1000-byte frame came back as 999 bytes" in garbler.stdout
    assert rows["protocol"][0] == rows["oversize refused"][0] == "pass"


def test_unknown_and_ambiguous_names_exit_2_listing_the_known(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine", "rdma"]) == 2
    out = capsys.readouterr().out
    assert "unknown engine 'rdma'" in out and "network: ['tcp', 'udp'" in out and "'file'" in out
    assert main(["--engine", "tcp", "--kind", "memory"]) == 2
    assert "unknown memory engine 'tcp'" in capsys.readouterr().out
    assert main(["--engine", "tcp", "--option", "x=1"]) == 2
    assert "network engines take no --option" in capsys.readouterr().out
