"""Executor settings from the command line: memory sizes and the cluster secret (from which
the node credential for a served registry is derived: executors hold no client token).

Every parse error is a ``ValueError`` whose message says what was given and what is
accepted, so the CLI can print it as is.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

__all__ = ["MIN_SECRET_BYTES", "format_size", "load_secret", "parse_memory_engine", "parse_size"]

MIN_SECRET_BYTES = 16

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """``"768MiB"`` -> 805306368, ``"8GiB"``, ``"1.5G"`` (decimal: 1.5e9), ``"4096"`` (bytes).

    Binary units (KiB, MiB, GiB, TiB; also Ki, Mi, ...) are powers of 1024; decimal ones
    (K/KB, M/MB, G/GB, T/TB) powers of 1000; case-insensitive. The result must be at least
    one byte. ``ValueError`` for anything else.
    """
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"bad memory size {text!r}: expected a number and an optional unit, like "
                         f"'768MiB', '8GiB', '1.5G' or '4096' (units: B, K, M, G, T and KiB, MiB, GiB, TiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise ValueError(f"bad memory size {text!r}: must be at least one byte")
    return value


def format_size(n: int) -> str:
    """A human reading of ``n`` bytes: ``805306368`` -> ``"768.0 MiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def load_secret(secret_file: Path | None = None, env: dict[str, str] | None = None) -> bytes:
    """The cluster secret: ``secret_file``'s contents (surrounding whitespace stripped), else
    ``$TRIPLANE_SECRET``, else the systemd credential ``$CREDENTIALS_DIRECTORY/secret``
    (``triplane.config.credential``). ``ValueError`` if none is given or it is shorter than
    16 bytes. Never a flag's value: a command line is visible to every user of the host."""
    from triplane.config import credential

    found = credential("secret", secret_file, "TRIPLANE_SECRET", env)
    if found is None:
        raise ValueError("no cluster secret: pass --secret-file, set TRIPLANE_SECRET or the systemd "
                         "credential 'secret' (the same secret on every process of the cluster)")
    secret, source = found
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the cluster secret from {source} is {len(secret)} bytes; "
                         f"at least {MIN_SECRET_BYTES} are needed")
    return secret


def parse_memory_engine(spec: str, memory_bytes: int) -> tuple[str, int, dict[str, Any]]:
    """``--memory-engine``: (engine name, capacity, options) for the registry.

    * ``host`` (or any engine's name): that engine of ``memory_bytes``;
    * ``file:DIR``: the file engine in DIR; ``redis://HOST:PORT/DB``: the redis engine;
    * ``host,file:DIR[@SIZE]``: ``host`` of ``memory_bytes`` that spills its least recently
      used tiles to DIR at capacity, holding up to SIZE more (default: half the free space
      of DIR's disk).
    """
    parts = [p.strip() for p in spec.split(",") if p.strip()] if isinstance(spec, str) else []
    if len(parts) == 1:
        return _one_engine(parts[0], memory_bytes)
    if len(parts) == 2 and parts[1].startswith("file:"):
        path, _, size = parts[1][5:].partition("@")
        if not path:
            raise ValueError(f"bad --memory-engine {spec!r}: file: needs a directory (file:/path)")
        Path(path).mkdir(parents=True, exist_ok=True)
        extra = parse_size(size) if size else shutil.disk_usage(path).free // 2
        return "spill", memory_bytes + extra, {"memory": memory_bytes, "path": path, "primary": parts[0]}
    raise ValueError(f"bad --memory-engine {spec!r}: expected one engine (host, file:DIR, redis://HOST:PORT) "
                     "or a memory engine that spills to a directory (host,file:DIR[@SIZE])")


def _one_engine(part: str, memory_bytes: int) -> tuple[str, int, dict[str, Any]]:
    if part.startswith("file:"):
        return "file", memory_bytes, {"path": part[5:]}
    if part.startswith("redis://"):
        return "redis", memory_bytes, {"url": part}
    return part, memory_bytes, {}
