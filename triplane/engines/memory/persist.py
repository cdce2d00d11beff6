"""Persistence targets: where a job's tiles are kept beyond the executor that made them.

A job submitted with ``"persist": "file"`` (or ``"redis"``) has every output tile of its
tasks written, as the task finishes, to the cluster's persistence target of that kind:
a file engine on a directory every executor and the scheduler see (a shared mount), or
a redis engine on a server they all reach. It is named by one spec, the same for every
process of the cluster: ``file:/shared/dir`` or ``redis://HOST:PORT/DB`` (``--persist-to``
of ``triplane executor``, ``$TRIPLANE_PERSIST_TO`` for both; several, comma-separated).

When the executor holding such a tile dies, the scheduler points its readers at the
target (the tile's holder becomes the node ``store:<kind>``) instead of computing it
again, and a fetch of a finished job reads it there.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

__all__ = ["PERSIST_ATTR", "PERSIST_ENV", "STORE_PREFIX", "persist_targets", "store_node"]

PERSIST_ATTR = "@persist"  # in a task packet's attrs: write the output to this kind's target
PERSIST_ENV = "TRIPLANE_PERSIST_TO"
STORE_PREFIX = "store:"  # the holder of a tile read from a persistence target


def store_node(kind: str) -> str:
    """The holder name of a tile kept by the persistence target of ``kind``."""
    return STORE_PREFIX + kind


def persist_targets(spec: str | None) -> dict[str, Any]:
    """kind -> engine for a spec (``file:DIR``, ``redis://...``, comma-separated); empty for
    None or "". ValueError naming a part that is neither."""
    from triplane.engines.memory.file import FileMemoryEngine

    out: dict[str, Any] = {}
    for part in (p.strip() for p in (spec or "").split(",")):
        if not part:
            continue
        if part.startswith("file:") and len(part) > 5:
            path = part[5:]
            os.makedirs(path, exist_ok=True)
            cap = max(shutil.disk_usage(path).free, 1)
            out["file"] = FileMemoryEngine(cap, path=path, name="persist")
        elif part.startswith("redis://"):
            from triplane.engines.memory.redis_engine import RedisMemoryEngine

            out["redis"] = RedisMemoryEngine(1 << 50, url=part, prefix="triplane:persist", name="persist")
        else:
            raise ValueError(f"bad persistence target {part!r}: expected file:DIR or redis://HOST:PORT/DB")
    return out
