"""The errors of the engine contracts (part of the ``TriplaneError`` tree).

    TriplaneError
    └── EngineError             an engine could not do what its contract promises
        ├── UnknownEngineError  no built-in or installed engine has that name
        ├── MemoryFullError     a tile does not fit in a memory engine's free capacity
        └── MissingTileError    a memory engine holds no tile of that id

Each names its ``kind`` (machine-readable, as every domain error does). A memory engine
raises exactly these two for a full memory and a missing tile, so the executor tells
them from a fault of the engine (anything else it raises), never by parsing a message.
"""

from __future__ import annotations

from triplane.proto.errors import TriplaneError

__all__ = ["CorruptTileError", "EngineError", "MemoryFullError", "MissingTileError", "UnknownEngineError"]


class EngineError(TriplaneError):
    """Base of the engine contracts' errors."""

    kind = "engine"


class UnknownEngineError(EngineError, LookupError):
    """No engine of that name: the message lists the known ones."""

    kind = "not_found"


class MemoryFullError(EngineError, MemoryError):
    """A tile (or a reservation) does not fit in the engine's free capacity. Nothing changed.
    Not the task's fault: the scheduler may run it on another node."""

    kind = "unavailable"


class MissingTileError(EngineError, KeyError):
    """No tile (or cache entry) of that id is held here."""

    kind = "not_found"

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else "no such tile"


class CorruptTileError(MissingTileError):
    """A stored tile failed its checksum when read back: it is treated as lost (the scheduler
    recomputes it), and the message names the tile, the engine and where it was stored."""
