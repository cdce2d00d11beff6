"""The one configuration schema of the long-running processes (``triplane scheduler``,
``triplane executor``): a TOML file, the environment and the command line, in that order
of precedence, lowest first (docs/deploy.md, "Configuration").

    flags  >  environment  >  file (--config FILE or $TRIPLANE_CONFIG)  >  defaults

The file has a ``[cluster]`` table (what every process of a cluster shares: the registry,
the metadb, where the secret is) and one table per role (``[scheduler]``, ``[executor]``)::

    [cluster]
    registry = "etcd://10.0.0.10:2379"
    db = "postgresql+psycopg://triplane@10.0.0.10/triplane"
    secret_file = "/etc/triplane/secret"

    [executor]
    bind = "0.0.0.0"
    memory = "32GiB"

A key's variable is ``TRIPLANE_<KEY>`` in ``[cluster]`` and ``TRIPLANE_<ROLE>_<KEY>`` in a
role's table (``TRIPLANE_EXECUTOR_MEMORY``). Secrets are never flags: the cluster secret
comes from ``secret_file``, else ``$TRIPLANE_SECRET``, else the systemd credential
``$CREDENTIALS_DIRECTORY/secret``; the scheduler's admin token the same way
(``token_file``, ``$TRIPLANE_TOKEN``, ``$CREDENTIALS_DIRECTORY/token``).

``advertise`` is the address the process publishes in the registry (where peers reach
it). It defaults to ``bind``; when ``bind`` is a wildcard (``0.0.0.0``), to the address of
the interface that routes to the registry's host. A loopback address is refused when the
registry is on another host: no peer could reach it.

Every error is a ``ConfigError`` (a ``ValueError``) naming the key, where its value came
from and what is accepted.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

try:
    import tomllib
except ImportError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["FIELDS", "ConfigError", "Resolved", "advertise_address", "credential", "load", "masked",
           "show"]

ROLES = ("scheduler", "executor")


class ConfigError(ValueError):
    """A bad value, file or combination: the message names the key and its source."""


@dataclass(frozen=True)
class Field:
    section: str  # "cluster" or a role
    key: str
    kind: type
    default: Any
    help: str
    secret: bool = False  # printed masked (a URL: its password only)
    roles: tuple[str, ...] = ROLES  # who reads it (a [cluster] key may concern one role only)

    @property
    def env(self) -> str:
        prefix = "TRIPLANE_" if self.section == "cluster" else f"TRIPLANE_{self.section.upper()}_"
        return prefix + self.key.upper()


FIELDS: tuple[Field, ...] = (
    Field("cluster", "registry", str, None, "etcd://HOST:PORT, or http://SCHEDULER (the registry a "
          "scheduler serves); the scheduler's default is memory:// (one host only)"),
    Field("cluster", "db", str, None, "the metadb URL (postgresql+psycopg://...; default: SQLite in "
          "the scheduler's run directory)", secret=True, roles=("scheduler",)),
    Field("cluster", "secret_file", str, None, "file holding the cluster secret (owner-only)"),
    Field("cluster", "log_level", str, "info", "debug, info, warning or error"),
    Field("scheduler", "bind", str, "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
    Field("scheduler", "advertise", str, None, "address published to executors and clients"),
    Field("scheduler", "port", int, 8470, "HTTP port of the REST API"),
    Field("scheduler", "packet_port", int, 0, "UDP+TCP packet port (0: any free)"),
    Field("scheduler", "data_port", int, 0, "TCP data port of uploads (0: any free)"),
    Field("scheduler", "run_dir", str, None, "run directory (uploads, SQLite; default $TRIPLANE_HOME)"),
    Field("scheduler", "token_file", str, None, "file holding the admin API token"),
    Field("scheduler", "grpc_port", int, None, "serve gRPC on this port too (0: any free)"),
    Field("executor", "bind", str, "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
    Field("executor", "advertise", str, None, "address published to the scheduler and peers"),
    Field("executor", "packet_port", int, 0, "UDP+TCP packet port (0: any free)"),
    Field("executor", "data_port", int, 0, "TCP data port of tiles (0: any free; fixed for a probe)"),
    Field("executor", "name", str, None, "node id (default <hostname>-<pid>)"),
    Field("executor", "memory", str, "8GiB", "host memory for tiles"),
    Field("executor", "engines", str, "auto", "op engines, comma-separated"),
    Field("executor", "memory_engine", str, "host", "memory engine of tiles"),
)


@dataclass(frozen=True)
class Resolved:
    """The effective configuration of one role: ``values[key]`` and ``sources[key]``
    (``flag``, ``env $NAME``, ``file PATH`` or ``default``)."""

    role: str
    values: dict[str, Any]
    sources: dict[str, str]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def fields(role: str) -> list[Field]:
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r} (known: {', '.join(ROLES)})")
    return [f for f in FIELDS if f.section in ("cluster", role) and role in f.roles]


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as e:
        raise ConfigError(f"cannot read the config file {str(path)!r}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"the config file {str(path)!r} is not valid TOML: {e}") from None
    known = {f.section: set() for f in FIELDS}
    for f in FIELDS:
        known[f.section].add(f.key)
    for section, table in data.items():
        if section not in known or not isinstance(table, dict):
            raise ConfigError(f"the config file {str(path)!r} has an unknown table [{section}] "
                              f"(known: {', '.join(f'[{s}]' for s in known)})")
        for key in table:
            if key not in known[section]:
                raise ConfigError(f"the config file {str(path)!r} has an unknown key {key!r} in "
                                  f"[{section}] (known: {', '.join(sorted(known[section]))})")
    return data


def _coerce(f: Field, value: Any, source: str) -> Any:
    if value is None:
        return None
    if f.kind is int:
        if isinstance(value, bool):
            raise ConfigError(f"{f.section}.{f.key} from {source} must be an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{f.section}.{f.key} from {source} must be an integer, "
                              f"got {value!r}") from None
    if not isinstance(value, str):
        raise ConfigError(f"{f.section}.{f.key} from {source} must be a string, got {value!r}")
    return value


def load(role: str, flags: Mapping[str, Any] | None = None, *, config_file: Path | str | None = None,
         env: Mapping[str, str] | None = None) -> Resolved:
    """The effective configuration of ``role``: each key from ``flags`` (a flag not given is
    None or absent), else its variable, else the file, else its default."""
    env = os.environ if env is None else env
    flags = flags or {}
    path = config_file if config_file is not None else env.get("TRIPLANE_CONFIG") or None
    data = _read_file(Path(path)) if path else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in fields(role):
        if flags.get(f.key) is not None:
            value, source = flags[f.key], "flag"
        elif env.get(f.env):
            value, source = env[f.env], f"env ${f.env}"
        elif f.key in data.get(f.section, {}):
            value, source = data[f.section][f.key], f"file {path}"
        else:
            value, source = f.default, "default"
        values[f.key] = _coerce(f, value, source)
        sources[f.key] = source
    return Resolved(role, values, sources)


def credential(name: str, path: str | Path | None, env_var: str,
               env: Mapping[str, str] | None = None) -> tuple[bytes, str] | None:
    """A secret and where it came from: the file ``path``, else ``$env_var``, else the systemd
    credential ``$CREDENTIALS_DIRECTORY/<name>``; None when none is set. Surrounding
    whitespace is stripped. ``ConfigError`` when a named file cannot be read."""
    env = os.environ if env is None else env
    if path is not None:
        try:
            return Path(path).read_bytes().strip(), f"file {path}"
        except OSError as e:
            raise ConfigError(f"cannot read the {name} file {str(path)!r}: {e.strerror or e}") from None
    if env.get(env_var):
        return env[env_var].strip().encode(), f"${env_var}"
    creds = env.get("CREDENTIALS_DIRECTORY")
    if creds and (Path(creds) / name).is_file():
        return (Path(creds) / name).read_bytes().strip(), f"systemd credential {name}"
    return None


def _is_wildcard(address: str) -> bool:
    return address in ("", "0.0.0.0", "::")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def advertise_address(bind: str, advertise: str | None, registry: str | None) -> str:
    """The address to publish: ``advertise``; else ``bind`` unless a wildcard; else the
    address of the interface that routes to the registry's host. ``ConfigError`` for a
    wildcard advertise, or a loopback one with a registry on another host."""
    target = urlsplit(registry or "").hostname
    remote = target is not None and not _is_loopback(target)
    if advertise:
        address, what = advertise, "advertise"
    elif not _is_wildcard(bind):
        address, what = bind, "bind"
    elif target is None:
        raise ConfigError(f"bind is {bind!r} (every interface) and the registry {registry!r} names "
                          "no host to route to: set advertise to this host's reachable address")
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((target, 9))  # no packet is sent: this picks the route's source address
            except OSError as e:
                raise ConfigError(f"no route to the registry host {target!r} ({e.strerror or e}): "
                                  "set advertise to this host's reachable address") from None
            address, what = s.getsockname()[0], f"the route to {target}"
    if _is_wildcard(address):
        raise ConfigError(f"advertise {address!r} is a wildcard: publish an address peers can reach")
    if remote and _is_loopback(address):
        raise ConfigError(f"{what} gives {address!r}, a loopback address, but the registry is on "
                          f"{target}: peers on other hosts could not reach it; bind to this host's "
                          "address (or 0.0.0.0) or set advertise")
    return address


def masked(f: Field, value: Any) -> Any:
    """``value`` as ``triplane config show`` prints it: a secret URL keeps all but its password."""
    if not f.secret or value is None:
        return value
    parts = urlsplit(str(value))
    if parts.password is None:
        return value
    netloc = parts.netloc.replace(f":{parts.password}@", ":****@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def show(role: str, resolved: Resolved, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The effective configuration as printed: each key's value (secrets masked) and source,
    and whether each credential is set (never its value)."""
    out: dict[str, Any] = {}
    for f in fields(role):
        out[f"{f.section}.{f.key}"] = {"value": masked(f, resolved[f.key]), "source": resolved.sources[f.key]}
    creds = [("secret", "secret_file", "TRIPLANE_SECRET")]
    if role == "scheduler":
        creds.append(("token", "token_file", "TRIPLANE_TOKEN"))
    for name, key, var in creds:
        try:
            found = credential(name, resolved[key], var, env)
        except ConfigError as e:
            out[name] = {"value": None, "source": f"unreadable: {e}"}
            continue
        out[name] = {"value": "****" if found else None, "source": found[1] if found else "not set"}
    return out
