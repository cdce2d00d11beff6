"""Gradients in the SDK: ``tp.grad`` and ``Tensor.backward``, both by the autograd
pass (``triplane.proto.autograd``, the one the scheduler runs) over the recorded graph."""

from __future__ import annotations

from collections.abc import Sequence

from triplane.proto.autograd import autograd
from triplane.proto.errors import NotDifferentiableError
from triplane.sdk.tensor import Tensor, build_graph, tensors_from_graph

__all__ = ["backward", "grad"]


def grad(output: Tensor, inputs: Sequence[Tensor] | Tensor,
         grad_output: Tensor | None = None) -> list[Tensor]:
    """d output / d input for each input, as lazy tensors (differentiable again).

    ``output`` must be a scalar unless ``grad_output`` (same shape) is given. An input
    the output does not depend on gets a zero gradient.
    """
    single = isinstance(inputs, Tensor)
    ins = [inputs] if single else list(inputs)
    outs = [output, *ins] + ([grad_output] if grad_output is not None else [])
    graph, tensors, _ = build_graph(outs, cut_realized=False)
    g, ids = autograd(graph, output._id, [t._id for t in ins],
                      grad_output._id if grad_output is not None else None)
    return tensors_from_graph(g, tensors, ids)


def backward(output: Tensor, grad_output: Tensor | None = None) -> None:
    leaves = _grad_leaves(output)
    if not leaves:
        raise NotDifferentiableError(
            "backward(): nothing this tensor depends on was created with requires_grad=True")
    for leaf, g in zip(leaves, grad(output, leaves, grad_output)):
        leaf.grad = g if leaf.grad is None else leaf.grad + g


def _grad_leaves(output: Tensor) -> list[Tensor]:
    found: list[Tensor] = []
    seen: set[int] = set()
    stack = [output]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.requires_grad and not t._inputs:
            found.append(t)
        stack.extend(t._inputs)
    return found
