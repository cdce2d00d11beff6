"""Gradients in the SDK: ``tp.grad`` and ``Tensor.backward``, both by the autograd
pass (``triplane.proto.autograd``, the one the scheduler runs) over the recorded graph,
and ``tp.no_grad()``.

Inside ``with tp.no_grad():`` (or a function decorated with ``@tp.no_grad()``) every
tensor recorded is cut from gradients: gradients do not flow through it into what it
was computed from, as if it were a constant. It still computes lazily; the cut is made
when a gradient is asked through it (the tensor is then computed, once, and becomes a
leaf holding its value). The mode is per thread, as PyTorch's.

``backward()`` also remembers its output (weakly) so that the next optimiser step
computes it in its graph run, before the parameters change: after
``loss.backward(); opt.step()``, ``loss.item()`` is this step's loss (see
``triplane.sdk.optim.base``).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from triplane.proto.autograd import autograd
from triplane.proto.errors import NotDifferentiableError
from triplane.proto.ir import Graph
from triplane.sdk import tensor as _tensor
from triplane.sdk.compile import signature
from triplane.sdk.tensor import Tensor, build_graph, realize, tensors_from_graph

__all__ = ["backward", "grad", "is_grad_enabled", "no_grad", "take_backward_outputs"]

F = TypeVar("F", bound=Callable[..., Any])

# Tensors recorded under no_grad, by id (a WeakValueDictionary: Tensor's == is elementwise,
# so tensors cannot be set members).
_CUT: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
_BACKWARD_OUTPUTS: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
_mode = threading.local()
_open_lock = threading.Lock()
_open = 0  # no_grad blocks open in all threads: the record hook is installed while > 0


def is_grad_enabled() -> bool:
    """False inside a ``no_grad`` block of this thread."""
    return getattr(_mode, "depth", 0) == 0


def _mark(t: Tensor) -> None:
    if getattr(_mode, "depth", 0):
        _CUT[id(t)] = t


class no_grad:
    """``with tp.no_grad(): ...`` or ``@tp.no_grad()``: record nothing for gradients."""

    def __enter__(self) -> no_grad:
        global _open
        _mode.depth = getattr(_mode, "depth", 0) + 1
        with _open_lock:
            _open += 1
            if _open == 1:
                _tensor.record_hooks.append(_mark)
        return self

    def __exit__(self, *exc: object) -> None:
        global _open
        _mode.depth -= 1
        with _open_lock:
            _open -= 1
            if _open == 0:
                _tensor.record_hooks.remove(_mark)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with no_grad():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _is_cut(t: Tensor) -> bool:
    return bool(_CUT) and _CUT.get(id(t)) is t


def _cut_reachable(outputs: Sequence[Tensor]) -> None:
    """Compute the no_grad tensors the outputs depend on and make them leaves."""
    if not _CUT:
        return
    found: list[Tensor] = []
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if _is_cut(t):
            if t._inputs:
                found.append(t)
            continue
        stack.extend(t._inputs)
    if found:
        realize(*found)
        for t in found:
            assert t._value is not None
            t.assign(t._value)


def grad(output: Tensor, inputs: Sequence[Tensor] | Tensor,
         grad_output: Tensor | None = None) -> list[Tensor]:
    """d output / d input for each input, as lazy tensors (differentiable again).

    ``output`` must be a scalar unless ``grad_output`` (same shape) is given. An input
    the output does not depend on (or only through a ``no_grad`` tensor) gets a zero
    gradient.
    """
    single = isinstance(inputs, Tensor)
    ins = [inputs] if single else list(inputs)
    outs = [output, *ins] + ([grad_output] if grad_output is not None else [])
    _cut_reachable([output])
    key, walk, _ = signature(outs, cut_realized=False)
    key = (key, grad_output is not None)
    rule = _RULES.get(key)
    if rule is not None:
        return rule.replay(walk)
    graph, tensors, _ = build_graph(outs, cut_realized=False)
    g, ids = autograd(graph, output._id, [t._id for t in ins],
                      grad_output._id if grad_output is not None else None)
    rule = _GradRule.record(g, ids, walk, tensors)
    if rule is not None:
        if len(_RULES) >= 256:
            _RULES.clear()
        _RULES[key] = rule
    return tensors_from_graph(g, tensors, ids)


class _GradRule:
    """What the autograd pass added to a graph of one structure (``sdk.compile.
    signature``), by position: each new node's op, inputs (a position in the walk of the
    differentiated graph, or ``len(walk) + k`` for the k-th new node), attributes and type,
    and where each gradient is. The pass reads nothing but the structure (ops, attributes,
    shapes, dtypes, which tensor feeds which, which are differentiated), so replaying this
    on another graph of the same structure makes the tensors the pass would make: a
    training step's ``backward()`` builds no graph and runs no pass after its first."""

    def __init__(self, nodes: list[tuple[str, tuple[int, ...], Any, Any]], results: list[int]) -> None:
        self.nodes = nodes
        self.results = results

    @classmethod
    def record(cls, g: Graph, ids: list[str], walk: list[Tensor], known: dict[str, Tensor]
               ) -> _GradRule | None:
        pos = {t._id: i for i, t in enumerate(walk)}
        if len(pos) != len(known) or any(i not in pos for i in known):
            return None  # the walk is not the graph's tensors: replay nothing
        nodes = []
        for nid in g.topo_order():
            if nid in pos:
                continue
            n = g.nodes[nid]
            nodes.append((n.op, tuple(pos[i] for i in n.inputs), n.attrs, n.type))
            pos[nid] = len(pos)
        return cls(nodes, [pos[i] for i in ids])

    def replay(self, walk: list[Tensor]) -> list[Tensor]:
        made = list(walk)
        for op, inputs, attrs, ty in self.nodes:
            made.append(Tensor(op, [made[i] for i in inputs], attrs, ty))
        return [made[i] for i in self.results]


# signature of the differentiated graph -> the rule the autograd pass made for it
_RULES: dict[Any, _GradRule] = {}


def backward(output: Tensor, grad_output: Tensor | None = None) -> None:
    if _is_cut(output):
        raise NotDifferentiableError("backward(): this tensor was computed inside tp.no_grad()")
    leaves = _grad_leaves(output)
    if not leaves:
        raise NotDifferentiableError(
            "backward(): nothing this tensor depends on was created with requires_grad=True")
    for leaf, g in zip(leaves, grad(output, leaves, grad_output)):
        leaf.grad = g if leaf.grad is None else leaf.grad + g
    if output._value is None:
        _BACKWARD_OUTPUTS[id(output)] = output


def take_backward_outputs() -> list[Tensor]:
    """The outputs ``backward()`` ran on since the last call that are still alive and not
    computed (the optimiser's step computes them before it changes parameters)."""
    outs = [t for t in _BACKWARD_OUTPUTS.values() if t._value is None]
    _BACKWARD_OUTPUTS.clear()
    return outs


def _grad_leaves(output: Tensor) -> list[Tensor]:
    found: list[Tensor] = []
    seen: set[int] = set()
    stack = [output]
    any_cut = bool(_CUT)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.requires_grad and not t._inputs:
            found.append(t)
        if not (any_cut and _is_cut(t)):
            stack.extend(t._inputs)
    return found
