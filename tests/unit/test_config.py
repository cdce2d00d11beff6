"""triplane/config.py: one schema for file, environment and flags; secrets masked; the
advertised address; and the commands that read it (``config show``, ``executor --join``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from triplane.config import ConfigError, advertise_address, credential, load, show


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "triplane.toml"
    p.write_text(text)
    return p


def test_flags_beat_the_environment_which_beats_the_file_which_beats_the_defaults(tmp_path: Path) -> None:
    f = _file(tmp_path, '[cluster]\nregistry = "etcd://10.0.0.1:2379"\nlog_level = "debug"\n'
                        '[executor]\nmemory = "2GiB"\nbind = "0.0.0.0"\n')
    env = {"TRIPLANE_EXECUTOR_MEMORY": "4GiB", "TRIPLANE_EXECUTOR_BIND": "10.0.0.2"}
    cfg = load("executor", {"bind": "10.0.0.3", "memory": None}, config_file=f, env=env)
    assert cfg["bind"] == "10.0.0.3" and cfg.sources["bind"] == "flag"
    assert cfg["memory"] == "4GiB" and cfg.sources["memory"] == "env $TRIPLANE_EXECUTOR_MEMORY"
    assert cfg["registry"] == "etcd://10.0.0.1:2379" and cfg.sources["registry"] == f"file {f}"
    assert cfg["engines"] == "auto" and cfg.sources["engines"] == "default"
    # $TRIPLANE_CONFIG names the file when no flag does
    assert load("executor", env={"TRIPLANE_CONFIG": str(f)})["log_level"] == "debug"


def test_bad_files_and_values_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'memroy' in \[executor\].*memory"):
        load("executor", config_file=_file(tmp_path, '[executor]\nmemroy = "1GiB"\n'), env={})
    with pytest.raises(ConfigError, match=r"unknown table \[workers\]"):
        load("executor", config_file=_file(tmp_path, '[workers]\nx = 1\n'), env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load("scheduler", config_file=_file(tmp_path, "[scheduler\n"), env={})
    with pytest.raises(ConfigError, match=r"scheduler\.port from env \$TRIPLANE_SCHEDULER_PORT must be"):
        load("scheduler", env={"TRIPLANE_SCHEDULER_PORT": "http"})
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load("scheduler", config_file=tmp_path / "absent.toml", env={})
    with pytest.raises(ConfigError, match="unknown role 'worker'"):
        load("worker", env={})


def test_show_masks_secrets_and_says_where_each_value_came_from(tmp_path: Path) -> None:
    env = {"TRIPLANE_DB": "postgresql+psycopg://triplane:hunter2-pw@db/triplane",
           "TRIPLANE_SECRET": "s" * 32, "TRIPLANE_TOKEN": "t" * 32}
    shown = show("scheduler", load("scheduler", env=env), env=env)
    text = json.dumps(shown)
    assert "hunter2" not in text and "s" * 32 not in text and "t" * 32 not in text
    assert shown["cluster.db"]["value"] == "postgresql+psycopg://triplane:****@db/triplane"
    assert shown["secret"] == {"value": "****", "source": "$TRIPLANE_SECRET"}
    assert shown["token"]["source"] == "$TRIPLANE_TOKEN"
    assert show("executor", load("executor", env={}), env={})["secret"]["source"] == "not set"


def test_credentials_come_from_a_file_the_environment_or_systemd(tmp_path: Path) -> None:
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "secret").write_text("from-systemd-0123456789\n")
    (tmp_path / "secret").write_text("from-file-0123456789\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}
    assert credential("secret", None, "TRIPLANE_SECRET", env) == (b"from-systemd-0123456789",
                                                                  "systemd credential secret")
    env["TRIPLANE_SECRET"] = "from-env-0123456789"
    assert credential("secret", None, "TRIPLANE_SECRET", env)[0] == b"from-env-0123456789"
    assert credential("secret", tmp_path / "secret", "TRIPLANE_SECRET", env)[0] == b"from-file-0123456789"
    assert credential("secret", None, "TRIPLANE_SECRET", {}) is None


def test_the_advertised_address() -> None:
    assert advertise_address("10.0.0.5", None, "etcd://10.0.0.1:2379") == "10.0.0.5"
    assert advertise_address("0.0.0.0", "node-7.example", "etcd://10.0.0.1:2379") == "node-7.example"
    # 0.0.0.0: the source address of the route to the registry's host (here loopback to loopback)
    assert advertise_address("0.0.0.0", None, "etcd://127.0.0.1:2379") == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"loopback address, but the registry is on 10\.0\.0\.1"):
        advertise_address("127.0.0.1", None, "etcd://10.0.0.1:2379")
    with pytest.raises(ConfigError, match="names no host"):
        advertise_address("0.0.0.0", None, "memory://")
    with pytest.raises(ConfigError, match="wildcard"):
        advertise_address("10.0.0.5", "0.0.0.0", "etcd://10.0.0.1:2379")


def _triplane(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("TRIPLANE_")}
    return subprocess.run([sys.executable, "-m", "triplane", *args], capture_output=True, text=True,
                          timeout=60, env={**full, **(env or {})}, check=False)


def test_config_show_and_the_executor_refusing_what_cannot_work(tmp_path: Path) -> None:
    f = _file(tmp_path, '[cluster]\nregistry = "etcd://10.9.9.9:2379"\n[executor]\nbind = "127.0.0.1"\n')
    r = _triplane("config", "show", "executor", "--config", str(f), "--json",
                  env={"TRIPLANE_SECRET": "x" * 20})
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["cluster.registry"] == {"value": "etcd://10.9.9.9:2379", "source": f"file {f}"}
    assert shown["secret"]["value"] == "****" and "x" * 20 not in r.stdout
    # A loopback address would be published to peers on other hosts: refused, exit 2.
    r = _triplane("executor", "--config", str(f), env={"TRIPLANE_SECRET": "x" * 20})
    assert r.returncode == 2 and "loopback" in r.stderr, r.stderr
    r = _triplane("executor", "--memory", "1GiB", env={"TRIPLANE_SECRET": "x" * 20})
    assert r.returncode == 2 and "no registry to join: pass --join" in r.stderr, r.stderr
    r = _triplane("config", "show", "worker")
    assert r.returncode == 2 and "unknown role 'worker'" in r.stderr
