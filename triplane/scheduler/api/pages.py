"""Pages of a list endpoint: ``{"items": [...], "next": <cursor or null>}`` (docs/api.md).

Every list endpoint takes ``limit`` (1..1000, default 50) and ``cursor``; a page's
``next`` is the cursor of the page after it, null on the last page. A cursor is opaque to
clients: the URL-safe base64 of a small JSON object holding the sort key of the page's
last item (``{"k": [created_at, id]}`` for jobs, ``{"k": [task id]}`` for tasks, ...), so
the next page is an indexed range read that starts after it (keyset paging: items stored
meanwhile do not shift the pages). A cursor that does not decode, or whose key has the
wrong shape for the endpoint, is a 400 of kind ``request``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from triplane.scheduler.errors import BadRequest

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "check_limit", "decode_cursor", "encode_cursor", "page"]

DEFAULT_LIMIT, MAX_LIMIT = 50, 1000
T = TypeVar("T")


def encode_cursor(key: Sequence[Any]) -> str:
    """The opaque cursor of a sort key (a short list of str and numbers)."""
    raw = json.dumps({"k": list(key)}, separators=(",", ":"), allow_nan=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, types: Sequence[type]) -> list[Any] | None:
    """The sort key in ``cursor`` (None for none), checked against ``types`` (one per
    element; ``float`` accepts an int); BadRequest naming the cursor otherwise."""
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)["k"]
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise BadRequest(f"cursor {cursor[:40]!r} is not a cursor of this list "
                         "(pass the 'next' of the previous page as it is)") from None
    ok = isinstance(key, list) and len(key) == len(types) and all(
        (type(v) in (int, float) if t is float else type(v) is t) for v, t in zip(key, types, strict=False))
    if not ok or any(isinstance(v, str) and ("\x00" in v or len(v) > 128) for v in key):
        raise BadRequest(f"cursor {cursor[:40]!r} is not a cursor of this list "
                         "(pass the 'next' of the previous page as it is)")
    return key


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be in 1..{MAX_LIMIT}, got {limit}")
    return limit


def page(items: list[T], limit: int, key: Callable[[T], Sequence[Any]]) -> dict[str, Any]:
    """The page body of ``items`` read with ``limit + 1`` (one more says there is a next)."""
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "next": encode_cursor(key(items[-1])) if more and items else None}
