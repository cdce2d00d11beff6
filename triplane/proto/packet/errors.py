"""The codec's exceptions: every rejection of received bytes is a ``PacketError``."""

from __future__ import annotations

from typing import Literal, NoReturn

from triplane.proto.errors import TriplaneError


class PacketError(TriplaneError, ValueError):
    """Received bytes were rejected. ``reason`` names the ``DropCounters`` field."""

    reason = "malformed"


class PacketTooLarge(PacketError):
    reason = "oversized"


class PacketMalformed(PacketError):
    reason = "malformed"


class PacketInvalid(PacketError):
    """A field is missing, unknown or of the wrong type; ``field`` is its dotted path."""

    reason = "invalid"

    def __init__(self, message: str, *, field: str = "") -> None:
        self.field = field
        super().__init__(f"field {field!r}: {message}" if field else message)


class PacketVersionError(PacketError):
    reason = "version"


class PacketSignatureError(PacketError):
    """Unsigned (``reason == "unsigned"``) or wrongly signed (``"bad_signature"``)."""

    def __init__(self, message: str, *, reason: Literal["unsigned", "bad_signature"]) -> None:
        self.reason = reason
        super().__init__(message)


class PacketStale(PacketError):
    reason = "stale"


def invalid_field(path: str, message: str) -> NoReturn:
    raise PacketInvalid(message, field=path)

