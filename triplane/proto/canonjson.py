"""Canonical JSON (RFC 8785 style): sorted keys (by UTF-16 code units), no insignificant
whitespace, UTF-8, numbers in ECMAScript's shortest round-trip form. The same value gives
the same bytes in every language, so a graph's hash names it. Also the strict reading
side: no NaN or infinities, no duplicate keys, integers beyond 2**53 read as doubles.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from triplane.proto.errors import GraphError
from triplane.proto.values import MAX_SAFE_INT, Attrs

__all__ = ["SlowPath", "canonical_json", "es_number", "fast_canonical", "jsonable", "loads_strict",
           "refuse_constants", "refuse_duplicate_keys"]


def loads_strict(data: bytes | str) -> Any:
    """``json.loads`` refusing NaN/Infinity (GraphError) and duplicate keys (GraphError);
    an integer literal beyond 2**53 reads as the double it stands for."""
    return json.loads(data, parse_constant=_GRAPH_CONSTANTS, parse_int=_parse_int,
                      object_pairs_hook=_GRAPH_KEYS)


def refuse_duplicate_keys(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A ``json.loads`` ``object_pairs_hook`` raising GraphError on a duplicate key, naming
    it (escaped: ``repr``) and ``where`` ("graph JSON", "the JSON document")."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        d = dict(pairs)
        if len(d) != len(pairs):
            seen: set[str] = set()
            dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise GraphError(f"duplicate key {dup[:80]!r} in {where}")
        return d

    return hook


def refuse_constants(where: str, hint: str = "") -> Callable[[str], Any]:
    """A ``json.loads`` ``parse_constant`` raising GraphError on NaN and (-)Infinity."""

    def hook(name: str) -> Any:
        raise GraphError(f"{where} holds {name}, which is not JSON{hint}")

    return hook


_GRAPH_KEYS = refuse_duplicate_keys("graph JSON")
_GRAPH_CONSTANTS = refuse_constants("graph JSON", " (use a 'constant' node)")


def _parse_int(text: str) -> int | float:
    # An integer literal beyond 2**53 can only be a double written in ECMAScript's plain
    # form (1e20 is "100000000000000000000"): read it back as that double.
    v = int(text)
    return v if abs(v) <= MAX_SAFE_INT else float(text)


_AT_OR_ABOVE_E000 = re.compile("[\ue000-\U0010ffff]")


def fast_canonical(make: Callable[[], Any]) -> bytes | None:
    """Where every float prints the same in Python and ECMAScript, the C json encoder
    writes the canonical bytes -- unless a key holds a character at or above U+E000, where
    code-point order and RFC 8785's UTF-16 order can differ. None where it cannot."""
    try:
        text = json.dumps(make(), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
        # (``isascii`` reads a flag CPython keeps; ``max`` walked every character: 0.5 ms
        # for a 16 KiB minibatch sent inline, base64 in a compiled step's request.)
        if text.isascii() or _AT_OR_ABOVE_E000.search(text) is None:
            return text.encode("utf-8")
    except (SlowPath, UnicodeEncodeError, ValueError, TypeError, RecursionError):
        pass
    return None


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8, ECMAScript number formatting."""
    fast = fast_canonical(lambda: jsonable(obj))
    if fast is not None:
        return fast
    out: list[str] = []
    try:
        _emit(obj, out)
        return "".join(out).encode("utf-8")
    except UnicodeEncodeError as e:
        raise GraphError(f"string is not valid Unicode (lone surrogate): {e}") from None
    except RecursionError:
        raise GraphError("value is nested too deeply for canonical JSON") from None


class SlowPath(Exception):
    pass


def jsonable(v: Any) -> Any:
    """``v`` with integral floats as ints (ECMAScript prints 2.0 as 2); raises SlowPath
    for anything the C encoder would write differently from the canonical form."""
    t = type(v)
    if t is str or v is None or t is bool:
        return v
    if t is int:
        if -MAX_SAFE_INT <= v <= MAX_SAFE_INT:
            return v
        raise SlowPath
    if t is float:
        if v.is_integer():  # ES prints 2.0 as 2; beyond 2**53 it pads shortest digits with 0s
            if abs(v) <= 2.0**53:
                return int(v)
            raise SlowPath
        if "e" in repr(v) or v != v:  # exponent forms differ; NaN/inf raise on the slow path
            raise SlowPath
        return v
    if t is Attrs or ((t is dict or isinstance(v, Mapping)) and all(type(k) is str for k in v)):
        return {k: x if type(x) is str else jsonable(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [x if type(x) is str else jsonable(x) for x in v]
    raise SlowPath


def _emit(v: Any, out: list[str]) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        if abs(v) > MAX_SAFE_INT:
            raise GraphError(f"integer {v} is beyond +-2**53: not every SDK can represent it "
                             "exactly (JSON numbers are doubles)")
        out.append(str(int(v)))
    elif isinstance(v, float):
        out.append(es_number(v))
    elif isinstance(v, str):
        out.append(json.dumps(v, ensure_ascii=False))
    elif isinstance(v, Mapping):
        out.append("{")
        # RFC 8785 orders keys by UTF-16 code units.
        for i, k in enumerate(sorted(v, key=lambda s: s.encode("utf-16-be"))):
            if i:
                out.append(",")
            out.append(json.dumps(str(k), ensure_ascii=False))
            out.append(":")
            _emit(v[k], out)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _emit(x, out)
        out.append("]")
    else:
        raise GraphError(f"cannot encode {type(v).__name__} {v!r} in canonical JSON")


def es_number(x: float) -> str:
    """The shortest round-trip decimal of a double, formatted as ECMAScript's
    Number.prototype.toString does (so Go and JS SDKs can match it byte for byte)."""
    if math.isnan(x) or math.isinf(x):
        raise GraphError(f"{x!r} is not representable in JSON (use a constant node)")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    r = repr(abs(x))
    mant, _, exp = r.partition("e")
    point = mant.find(".")
    digits = mant.replace(".", "")
    n = (point if point >= 0 else len(mant)) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        s = digits + "0" * (n - k)
    elif 0 < n <= 21:
        s = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        s = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        es = f"e{'+' if e >= 0 else '-'}{abs(e)}"
        s = digits + es if k == 1 else digits[0] + "." + digits[1:] + es
    return sign + s
