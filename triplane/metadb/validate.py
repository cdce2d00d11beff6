"""States, bounds and the checks every repository call applies before touching the database.

Checking here (not relying on the database) keeps bad input from reaching SQL and makes
both backends reject the same things: SQLite, for one, does not enforce VARCHAR lengths.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal, get_args

from triplane.metadb.errors import InvalidInputError, PayloadTooLargeError
from triplane.proto.limits import MAX_ID_LENGTH, MAX_RANK
from triplane.proto.states import TERMINAL_TASK_STATES as _TERMINAL_TASKS
from triplane.proto.states import TaskState

JobState = Literal["submitted", "compiling", "running", "done", "failed", "cancelled"]
TileState = Literal["planned", "present", "lost", "freed"]
ErrorKind = Literal["user", "infra"]

JOB_STATES: tuple[str, ...] = get_args(JobState)
TASK_STATES: tuple[str, ...] = tuple(s.value for s in TaskState)  # the dispatcher's, one vocabulary
TILE_STATES: tuple[str, ...] = get_args(TileState)
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)
TERMINAL_JOB_STATES = frozenset({"done", "failed", "cancelled"})
TERMINAL_TASK_STATES = frozenset(s.value for s in _TERMINAL_TASKS)

MAX_ID = MAX_ID_LENGTH             # ids and names (job, task, node, engine, tensor, op)
MAX_GRAPH_BYTES = 32 * 1024 * 1024  # canonical graph JSON
MAX_PLAN_BYTES = 64 * 1024 * 1024   # a plan encoded as JSON
MAX_PAYLOAD_BYTES = 64 * 1024       # an event payload encoded as JSON
MAX_FETCH = 10_000                  # names in a job's fetch list
MAX_TILE_RANK = MAX_RANK
MAX_ERROR_CHARS = 8192              # longer error messages are truncated, not rejected


def check_id(field: str, value: object) -> str:
    """``value`` if it is a non-empty str of at most MAX_ID characters without NUL."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{field} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID:
        raise InvalidInputError(f"{field} is {len(value)} characters long (at most {MAX_ID})")
    if "\x00" in value:
        # PostgreSQL refuses NUL in text; SQLite would store it. Refuse on both.
        raise InvalidInputError(f"{field} contains a NUL character")
    return value


MAX_NAME, MAX_TAG, MAX_TAGS = 128, 64, 16  # a job's name, each tag, tags per job


def check_label(field: str, value: object, bound: int) -> str:
    """A job's name or tag: a non-empty str of at most ``bound`` characters, no control
    characters."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{field} must be a non-empty string, got {value!r:.60}")
    if len(value) > bound:
        raise InvalidInputError(f"{field} is {len(value)} characters long (at most {bound})")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidInputError(f"{field} contains a control character")
    return value


def check_tags(value: object) -> tuple[str, ...]:
    """A job's tags: a list of at most MAX_TAGS labels (duplicates dropped, order kept)."""
    if not isinstance(value, (list, tuple)) or len(value) > MAX_TAGS:
        raise InvalidInputError(f"tags must be a list of at most {MAX_TAGS} strings")
    return tuple(dict.fromkeys(check_label(f"tags[{i}]", t, MAX_TAG) for i, t in enumerate(value)))


def check_optional_id(field: str, value: object) -> str | None:
    return None if value is None else check_id(field, value)


def check_state(field: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidInputError(f"{field}: unknown state {value!r} (known states: {list(allowed)})")
    return str(value)


def check_time(field: str, value: object) -> float | None:
    """Unix seconds as a finite float, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(f"{field} must be finite seconds, got {value!r}")
    return float(value)


def check_count(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{field} must be a non-negative int, got {value!r}")
    return value


def check_ints(field: str, value: object, *, max_len: int = MAX_TILE_RANK) -> list[int]:
    """A list of non-negative ints (a tile index or shape)."""
    if not isinstance(value, (list, tuple)) or len(value) > max_len:
        raise InvalidInputError(f"{field} must be a list of at most {max_len} ints, got {value!r}")
    return [check_count(f"{field}[{i}]", v) for i, v in enumerate(value)]


def json_size(field: str, value: Any, limit: int) -> int:
    """The encoded size of ``value`` as strict JSON; raises if it is not JSON or too large.

    NaN and infinities are refused: PostgreSQL's json type rejects them, and a value that one
    backend stores and the other refuses is a bug waiting for production.
    """
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{field} is not JSON-serialisable: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > limit:
        raise PayloadTooLargeError(f"{field} is {size} bytes encoded (at most {limit})")
    if "\\u0000" in text:
        raise InvalidInputError(f"{field} contains a NUL character")
    return size


def clip_error(message: object) -> str | None:
    """An error message bounded to MAX_ERROR_CHARS (the head is kept: it names the failure)."""
    if message is None:
        return None
    text = str(message).replace("\x00", "\\0")
    if len(text) > MAX_ERROR_CHARS:
        return text[: MAX_ERROR_CHARS - 32] + f" ... [{len(text) - MAX_ERROR_CHARS + 32} chars cut]"
    return text
