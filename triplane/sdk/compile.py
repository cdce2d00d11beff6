"""Compiled steps: recognising a graph's structure cheaply, and ``tp.compile``.

A training loop records the same graph every step with new values. Canonicalising that
graph, hashing its canonical JSON, validating and planning it again costs more than
running a small model. A session therefore keys what it compiled by :func:`signature`:
a tuple built in one walk over the recorded tensors (op, attributes, shape and dtype of
each, which earlier tensor feeds which input, which tensors are host data) -- no node
objects, no JSON, no hash of the whole document. Two recordings with equal signatures
are the same graph up to names and input values, so they share one compiled step; the
walk also returns the host inputs in a fixed order, which is how a compiled step binds
new values (:class:`TraceCache` holds what each session keeps per signature).

``tp.compile(step_fn)`` marks a function whose graph runs should be compiled steps and
counts them: ``step.cache_info()`` says how many of its graph runs replayed a compiled
step (hits) and how many compiled one (misses). The Python code of ``step_fn`` still runs
each call (it records the lazy tensors and keeps side effects such as an optimiser's
``step()``, so it may branch, print and change Python state freely); what a hit skips is
everything after recording: canonicalisation, hashing, validation, planning, and -- on a
cluster -- sending the graph. A recording with another shape, dtype or op is another
signature and compiles once more (a miss).
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from triplane.sdk.tensor import Tensor

__all__ = ["CompiledFunction", "TraceCache", "compile", "signature"]

V = TypeVar("V")


def signature(outputs: Sequence[Tensor], *, cut_realized: bool = True
              ) -> tuple[tuple[Any, ...], list[Tensor], list[Tensor]]:
    """The structure of the graph computing ``outputs`` (a hashable tuple), every tensor
    of it in walk order, and its host inputs (tensors holding a value) in walk order.

    Tensors holding a value are inputs, as ``build_graph`` makes them (with
    ``cut_realized=False``, as ``build_graph(..., cut_realized=False)`` does: only those
    without inputs; a computed tensor is then walked through). Attribute values compare
    by equality and type, so ``1`` and ``1.0`` differ."""
    index: dict[int, int] = {}
    walk: list[Tensor] = []
    inputs: list[Tensor] = []
    entries: list[Any] = []
    attrs_id = _attrs_id
    for out in outputs:
        stack = [out]
        expanded: set[int] = set()  # tensors whose inputs are on the stack above them
        while stack:
            t = stack[-1]
            k = id(t)
            if k in index:
                stack.pop()
                continue
            ins = t._inputs
            ty = t._type
            if t._value is not None and (cut_realized or not ins):
                stack.pop()
                index[k] = len(walk)
                walk.append(t)
                inputs.append(t)
                entries.append((ty.shape, ty.dtype.name))
                continue
            if ins and k not in expanded:  # walk the inputs first, then come back to t
                expanded.add(k)
                for i in reversed(ins):
                    if id(i) not in index:
                        stack.append(i)
                continue
            stack.pop()
            index[k] = len(walk)
            walk.append(t)
            entries.append((t._op, attrs_id(t._attrs), ty.shape, ty.dtype.name,
                            tuple([index[id(i)] for i in ins])))
    entries.append(tuple([index[id(o)] for o in outputs]))
    return tuple(entries), walk, inputs


# Attributes -> a number standing for their value and the types of their values (so the
# signature holds ints, cheap to hash and compare, not attribute mappings). By identity
# first (the Attrs object is kept, so its id is not reused while it is here); numbers are
# never reused, so clearing either map costs lookups (and, for the values, a new number:
# a structure seen before compiles once more) but never makes two structures equal.
_ATTRS_BY_ID: dict[int, tuple[Any, int]] = {}
_ATTRS_BY_VALUE: dict[Any, int] = {}
_attrs_lock = threading.Lock()
_attrs_numbers = itertools.count()


def _attrs_id(a: Any) -> int:
    found = _ATTRS_BY_ID.get(id(a))
    if found is not None and found[0] is a:
        return found[1]
    key = (a, tuple(map(type, a.values())))
    with _attrs_lock:
        n = _ATTRS_BY_VALUE.get(key)
        if n is None:
            if len(_ATTRS_BY_VALUE) >= 65536:
                _ATTRS_BY_VALUE.clear()
            n = _ATTRS_BY_VALUE[key] = next(_attrs_numbers)
        if len(_ATTRS_BY_ID) >= 8192:
            _ATTRS_BY_ID.clear()
        _ATTRS_BY_ID[id(a)] = (a, n)
    return n


class TraceCache(Generic[V]):
    """An LRU map signature -> compiled step, with hit and miss counters."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Any, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Any) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                _count("misses")
                return None
            self._items.move_to_end(key)
            self.hits += 1
            _count("hits")
            return item

    def put(self, key: Any, item: V) -> None:
        with self._lock:
            self._items[key] = item
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def drop(self, key: Any) -> None:
        with self._lock:
            self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


_active = threading.local()  # the CompiledFunction calls open in this thread


def _count(what: str) -> None:
    for f in getattr(_active, "stack", ()):
        setattr(f, what, getattr(f, what) + 1)


class CompiledFunction:
    """``step_fn`` wrapped by :func:`compile`: call it as the function; ``hits`` and
    ``misses`` count the compiled steps its graph runs replayed and compiled."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.hits = self.misses = 0
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        stack = getattr(_active, "stack", None)
        if stack is None:
            stack = _active.stack = []
        stack.append(self)
        try:
            return self.fn(*args, **kwargs)
        finally:
            stack.pop()

    def cache_info(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", self.fn)
        return f"tp.compile({name!r}, hits={self.hits}, misses={self.misses})"


def compile(fn: Callable[..., Any] | None = None) -> Any:
    """``tp.compile(step_fn)`` or ``@tp.compile``: see the module docstring."""
    if fn is None:
        return compile
    return CompiledFunction(fn)
