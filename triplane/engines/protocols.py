"""The engine contracts: small Protocols a vendor implements in one module each.

:class:`OpEngine` computes; :class:`MemoryEngine` holds tiles. The executor uses nothing
of an engine beyond what its Protocol names, and finds engines by name through
:mod:`triplane.engines.registry` (built-ins, then entry points). Errors are those of
:mod:`triplane.engines.errors`. :mod:`triplane.engines.memory.testing` checks a memory
engine against this contract, :mod:`triplane.engines.testing` an op engine against numpy.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from triplane.proto.ir import TensorType

__all__ = ["MemoryEngine", "OpEngine", "members", "mismatches"]


@runtime_checkable
class OpEngine(Protocol):
    """Computes ops on arrays held by a memory engine of the same node.

    ``run`` returns one array of exactly ``out``'s shape and dtype, or raises
    :class:`triplane.proto.errors.KernelError` (a user error, not retried). Any other
    exception is treated as an infrastructure fault of the engine.
    """

    name: str
    device: str

    def supports(self, op: str, dtypes: Sequence[str]) -> bool: ...

    def run(self, op: str, inputs: Sequence[Any], attrs: Mapping[str, Any], out: TensorType) -> Any: ...

    def benchmark(self) -> Mapping[str, float]: ...


@runtime_checkable
class MemoryEngine(Protocol):
    """Holds a node's tiles by id within a capacity in bytes: everything the executor asks
    of its memory engine (the task runner, the data port, the registry records, stats).

    Made by the registry as ``cls(capacity=<bytes>, **options)``. Thread-safe: kernels
    finish in worker threads while the event loop serves reads.

    **Tiles** (placed by the scheduler, released by it):

    * ``put(key, array, reserved=0)`` stores the array (replacing a tile of that key) and
      counts its ``nbytes``; the stored array is read-only and never written afterwards.
      :class:`~triplane.engines.errors.MemoryFullError` if it does not fit (nothing
      changes). ``reserved`` bytes claimed with ``reserve`` are consumed by the put (and
      released even if it fails).
    * ``get(key)`` returns the stored array (a tile, else a cache entry), never a copy;
      :class:`~triplane.engines.errors.MissingTileError` if neither is held.
    * ``delete(key)`` is idempotent (the scheduler may release a tile twice).
    * ``reserve(nbytes, key=None)`` claims bytes for a tile about to be put (a writer
      that must allocate first: the data port reading off a socket), so two concurrent
      writers cannot both pass the capacity check; a held ``key``'s bytes count as
      available. MemoryFullError if they are not free. ``release(nbytes)`` gives back a
      reservation that will not be put.
    * ``key in engine``: a tile or cache entry of that id is held. ``len(engine)`` and
      ``keys()``: the tiles (cache entries not counted).

    **Accounting**: ``capacity()``; ``used()`` (bytes of tiles); ``cached()`` (bytes of
    cache entries); ``free()`` (what a tile can still get: capacity less tiles,
    reservations and cache entries in use; entries not in use count as free, as ``put``
    evicts them). ``free()`` is the figure published to the registry.

    **Cache entries**: copies of immutable data (upload tiles pulled from the scheduler)
    that nobody releases. They share the capacity but are reclaimable: ``put`` and
    ``reserve`` evict them, least recently used first, so an entry never makes a tile
    fail to fit. ``cache_put(key, array) -> bool`` keeps one (False when it cannot be kept
    now; a tile of that key wins); ``cache_take(key)`` returns it and marks it in use
    (None if not kept) until ``cache_done(key)``; an entry in use is never evicted.
    ``cache_drop(key)`` forgets one even in use. ``cache_keys()`` lists them, least
    recently used first; ``cache_report()`` gives the counters (``stored``,
    ``evictions``, ``evicted_bytes``, ``refused``, ``dropped``) and ``lost``: the keys of
    the latest entries lost, oldest first (the scheduler forgets them).
    """

    name: str
    kind: str

    # --- tiles ---------------------------------------------------------------------------

    def put(self, key: str, value: np.ndarray, *, reserved: int = 0) -> None: ...

    def get(self, key: str) -> np.ndarray: ...

    def delete(self, key: str) -> None: ...

    def reserve(self, nbytes: int, key: str | None = None) -> None: ...

    def release(self, nbytes: int) -> None: ...

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...

    def keys(self) -> list[str]: ...

    # --- accounting ----------------------------------------------------------------------

    def capacity(self) -> int: ...

    def used(self) -> int: ...

    def cached(self) -> int: ...

    def free(self) -> int: ...

    # --- cache entries -------------------------------------------------------------------

    def cache_put(self, key: str, value: np.ndarray) -> bool: ...

    def cache_take(self, key: str) -> np.ndarray | None: ...

    def cache_done(self, key: str) -> None: ...

    def cache_drop(self, key: str) -> None: ...

    def cache_keys(self) -> list[str]: ...

    def cache_report(self) -> dict[str, Any]: ...


def members(protocol: type) -> dict[str, inspect.Signature | None]:
    """What ``protocol`` names: each method with its signature, each attribute with None."""
    out: dict[str, inspect.Signature | None] = dict.fromkeys(inspect.get_annotations(protocol))
    prefix = protocol.__qualname__ + "."
    for name, value in vars(protocol).items():
        if inspect.isfunction(value) and value.__qualname__.startswith(prefix):
            out[name] = inspect.signature(value)
    return out


def mismatches(obj: object, protocol: type) -> list[str]:
    """How ``obj`` falls short of ``protocol``: a member it lacks, a method that is not
    callable, or one that cannot be called as the protocol says (a parameter missing,
    renamed, of another kind, or without the default the protocol gives it). Empty if
    it conforms. Types are not checked (Python keeps no runtime types)."""
    problems = []
    for name, want in members(protocol).items():
        if not hasattr(obj, name):
            problems.append(f"{name}: missing")
            continue
        if want is None:
            continue
        impl = getattr(obj, name)
        if not callable(impl):
            problems.append(f"{name}: not a method")
            continue
        try:
            got = inspect.signature(impl)
        except (TypeError, ValueError):  # a builtin without a signature: cannot tell
            continue
        problems += [f"{name}: {p}" for p in _call_problems(want, got)]
    return problems


def _call_problems(want: inspect.Signature, got: inspect.Signature) -> list[str]:
    params = list(want.parameters.values())[1:]  # the protocol's function has self
    have = got.parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in have.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in have.values())
    problems = []
    for i, p in enumerate(params):
        q = have.get(p.name)
        if q is None:
            ok = var_kw if p.kind is p.KEYWORD_ONLY else var_pos and var_kw
            if not ok:
                problems.append(f"no parameter {p.name!r}")
            continue
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if q.kind not in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD) or list(have).index(p.name) != i:
                problems.append(f"parameter {p.name!r} is not positional at place {i}")
        elif q.kind not in (q.KEYWORD_ONLY, q.POSITIONAL_OR_KEYWORD):
            problems.append(f"parameter {p.name!r} cannot be given by keyword")
        if p.default is not p.empty and q.default is q.empty:
            problems.append(f"parameter {p.name!r} needs the default the protocol gives it")
    names = {p.name for p in params}
    for q in have.values():
        if q.name not in names and q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            problems.append(f"extra required parameter {q.name!r}")
    return problems
