"""Client tokens on disk: ``tokens.json`` in the run directory (mode 0600).

One object ``{"version": 1, "tokens": [{"name", "role", "sha256", "created"}, ...]}``.
Only the SHA-256 of each token is stored, so reading the file does not give a token
away; the token itself is shown once, when it is made (``triplane tokens add``). Names
are the owners of the jobs their tokens submit, so they are short plain ids.

The admin token of ``triplane up`` (the run directory's ``token`` file, which
``tp.connect()`` reads) is not listed here: the scheduler takes it with ``--token-file``.

:class:`TokenBook` is the scheduler's view of the file: it re-reads it when it changes
(mtime, size or inode), so a token added or removed while the cluster runs counts at
once; a file that cannot be read or parsed keeps the last good listing (and is logged).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ROLES",
    "TokenBook",
    "TokenEntry",
    "add_token",
    "hash_token",
    "read_tokens",
    "remove_token",
]

log = logging.getLogger(__name__)

ROLES = ("admin", "submit", "read")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: str
    sha256: str
    created: float = 0.0


def hash_token(token: str | bytes) -> str:
    """The hex SHA-256 of a token (what ``tokens.json`` stores)."""
    data = token.encode("utf-8", "surrogateescape") if isinstance(token, str) else token
    return hashlib.sha256(data).hexdigest()


# The admin token of the run directory is principal "admin" and the node credential
# "node": a listed token of either name would own (and so see) their jobs.
RESERVED_NAMES = frozenset({"admin", "node"})


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"bad token name {name!r}: 1 to 64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    if name in RESERVED_NAMES:
        raise ValueError(f"the token name {name!r} is reserved (the run directory's admin token "
                         "and the node credential go by 'admin' and 'node')")
    return name


def check_role(role: object) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} (known: {list(ROLES)})")
    return str(role)


def read_tokens(path: Path) -> list[TokenEntry]:
    """The entries of ``path`` (none if it does not exist). ValueError if it is malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    try:
        doc = json.loads(text)
        entries = doc["tokens"]
        if doc.get("version") != 1 or not isinstance(entries, list):
            raise ValueError("expected version 1 and a list of tokens")
        out = []
        for e in entries:
            digest = e["sha256"]
            if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
                raise ValueError(f"token {e.get('name')!r}: sha256 is not 64 hex digits")
            out.append(TokenEntry(check_name(e["name"]), check_role(e["role"]), digest,
                                  float(e.get("created") or 0.0)))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"malformed token file {str(path)!r}: {e}") from None
    return out


def _write(path: Path, entries: list[TokenEntry]) -> None:
    doc = {"version": 1, "tokens": [
        {"name": e.name, "role": e.role, "sha256": e.sha256, "created": e.created} for e in entries]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def add_token(path: Path, name: str, role: str) -> str:
    """Make a fresh token named ``name`` with ``role``, record its hash in ``path`` (created
    0600 if missing) and return the token -- the only time it is seen. ValueError for a bad
    name or role, or a name already there."""
    check_name(name)
    check_role(role)
    entries = read_tokens(path)
    if any(e.name == name for e in entries):
        raise ValueError(f"a token named {name!r} exists already (remove it first)")
    token = secrets.token_urlsafe(32)
    entries.append(TokenEntry(name, role, hash_token(token), time.time()))
    _write(Path(path), entries)
    return token


def remove_token(path: Path, name: str) -> bool:
    """Drop the token named ``name``; whether there was one."""
    entries = read_tokens(path)
    kept = [e for e in entries if e.name != name]
    if len(kept) == len(entries):
        return False
    _write(Path(path), kept)
    return True


class TokenBook:
    """Who a bearer token is: ``lookup(token)`` -> the matching entry or None.

    Each lookup hashes the token once and compares it with every entry's hash in constant
    time (``hmac.compare_digest``, no early exit), so timing tells nothing about which
    entry, or how much of one, matched."""

    def __init__(self, path: Path | None, extra: list[TokenEntry] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._extra = list(extra or [])
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[TokenEntry] = []

    def _current(self) -> list[TokenEntry]:
        if self.path is None:
            return self._extra
        try:
            st = self.path.stat()
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        except OSError as e:
            log.warning("cannot stat the token file %s: %s", self.path, e)
            return self._extra + self._entries
        if stamp != self._stamp:
            try:
                self._entries = read_tokens(self.path) if stamp is not None else []
            except (ValueError, OSError) as e:
                log.error("%s; keeping the %d tokens read before", e, len(self._entries))
            self._stamp = stamp
        return self._extra + self._entries

    def lookup(self, token: str) -> TokenEntry | None:
        digest = hash_token(token).encode("ascii")
        found = None
        for e in self._current():
            if hmac.compare_digest(digest, e.sha256.encode("ascii")) and found is None:
                found = e
        return found

    def entries(self) -> list[dict[str, Any]]:
        """Name and role of each known token (never the hashes)."""
        return [{"name": e.name, "role": e.role} for e in self._current()]
