"""Optimizers: ``SGD`` and ``Adam``, with torch's update rules.

Contract of :meth:`Optimizer.step`: the update of every parameter that has a gradient
is built lazily and computed in ONE graph run (:func:`triplane.realize` of all new
values and new state together), then written with :meth:`Tensor.assign`. Parameters
whose ``.grad`` is None are left alone. Optimizer state (momentum, moments) is kept as
realized tensors with no history, so graphs never grow step after step.

Values that change every step (Adam's bias corrections) enter the graph as host
inputs, not as attributes, so every step's graph hashes the same and the compiled
plan is reused.

Modules may hold pending updates that must be realized together with the step (e.g.
BatchNorm running statistics); they register them with :func:`add_pending_update`, and
``step()`` realizes and assigns them in the same graph run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from triplane.sdk.tensor import Tensor, realize

__all__ = ["SGD", "Adam", "Optimizer", "add_pending_update", "clip_grad_norm", "flush_pending_updates"]

# (target leaf, lazy new value) pairs to realize with the next optimizer step or flush.
_PENDING: list[tuple[Tensor, Tensor]] = []


def add_pending_update(target: Tensor, new_value: Tensor) -> None:
    """Schedule ``target.assign(new_value)`` for the next ``step()`` or
    :func:`flush_pending_updates` (a later update of the same target replaces it)."""
    for i, (t, _) in enumerate(_PENDING):
        if t is target:
            _PENDING[i] = (target, new_value)
            return
    _PENDING.append((target, new_value))


def flush_pending_updates(*also: Tensor) -> None:
    """Realize pending updates (and ``also``) in one graph run and assign them."""
    pending = list(_PENDING)
    _PENDING.clear()
    realize(*also, *(v for _, v in pending))
    for target, value in pending:
        target.assign(value.numpy())


def _detached(value: np.ndarray) -> Tensor:
    return Tensor.from_array(value)


class Optimizer:
    """Base class: holds the parameter list and per-parameter state."""

    def __init__(self, params: Iterable[Tensor], defaults: dict[str, Any]) -> None:
        self.params: list[Tensor] = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise TypeError(f"parameter {i} is a {type(p).__name__}, not a Tensor")
            if not p.dtype.is_float:
                raise TypeError(f"parameter {i} has dtype {p.dtype.name}; only floats can be optimized")
        self.defaults = defaults
        self.state: list[dict[str, Tensor]] = [{} for _ in self.params]
        self.steps = 0

    def zero_grad(self) -> None:
        """Forget the gradients (``backward`` accumulates into ``.grad``)."""
        for p in self.params:
            p.grad = None

    def _update(self, i: int, p: Tensor, g: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The lazy new value of parameter ``i`` and its new state tensors."""
        raise NotImplementedError

    def _scalar(self, value: float, like: Tensor) -> Tensor:
        # A host input (not an attribute) so step-dependent values keep the graph's hash.
        return Tensor.from_array(np.asarray(value, dtype=like.dtype.np))

    def step(self, *also: Tensor) -> None:
        """Apply one update to every parameter with a gradient, in one graph run.

        Parameters are assigned in place, so a lazy tensor that reads them and is not
        computed yet would see the NEW values afterwards. The step therefore also realizes
        the gradients themselves and ``also`` (pass the loss: ``opt.step(loss)`` then
        ``loss.item()`` reads the loss of this step, at no extra graph run).
        """
        self.steps += 1
        grads: list[Tensor] = []
        jobs: list[tuple[int, Tensor, dict[str, Tensor]]] = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            if g.shape != p.shape:
                raise ValueError(f"parameter {i}: gradient shape {list(g.shape)} != {list(p.shape)}")
            grads.append(g)
            if g.dtype != p.dtype:
                g = g.astype(p.dtype)
            new, state = self._update(i, p, g)
            jobs.append((i, new, state))
        pending = list(_PENDING)
        _PENDING.clear()
        realize(*also, *grads, *(t for _, new, st in jobs for t in (new, *st.values())),
                *(v for _, v in pending))
        for i, new, state in jobs:
            self.params[i].assign(new.numpy())
            self.state[i] = {k: _detached(v.numpy()) for k, v in state.items()}
        for target, value in pending:
            target.assign(value.numpy())


class SGD(Optimizer):
    """Stochastic gradient descent, torch's rule::

        g = grad + weight_decay * p
        buf = g (first step) else momentum * buf + g
        p = p - lr * buf            (p - lr * g without momentum)
    """

    def __init__(self, params: Iterable[Tensor], lr: float = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: need lr > 0, momentum >= 0, weight_decay >= 0 "
                             f"(got lr={lr}, momentum={momentum}, weight_decay={weight_decay})")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def _update(self, i: int, p: Tensor, g: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        if self.weight_decay:
            g = g + self.weight_decay * p
        if not self.momentum:
            return p - self._scalar(self.lr, p) * g, {}
        buf = self.state[i].get("momentum")
        buf = g if buf is None else self.momentum * buf + g
        return p - self._scalar(self.lr, p) * buf, {"momentum": buf}


class Adam(Optimizer):
    """Adam (Kingma & Ba), torch's rule (weight decay is L2 added to the gradient)::

        g = grad + weight_decay * p
        m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)
    """

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        b1, b2 = betas
        if lr <= 0 or not (0 <= b1 < 1 and 0 <= b2 < 1) or eps < 0 or weight_decay < 0:
            raise ValueError(f"Adam: need lr > 0, 0 <= betas < 1, eps >= 0, weight_decay >= 0 "
                             f"(got lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay})")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.lr, self.betas, self.eps, self.weight_decay = lr, (b1, b2), eps, weight_decay

    def _update(self, i: int, p: Tensor, g: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        from triplane.sdk.elementwise import sqrt

        b1, b2 = self.betas
        t = self.steps
        if self.weight_decay:
            g = g + self.weight_decay * p
        st = self.state[i]
        m = (1 - b1) * g if "m" not in st else b1 * st["m"] + (1 - b1) * g
        v = (1 - b2) * (g * g) if "v" not in st else b2 * st["v"] + (1 - b2) * (g * g)
        step_size = self._scalar(self.lr / (1 - b1**t), p)
        denom = sqrt(v * self._scalar(1.0 / (1 - b2**t), p)) + self.eps
        return p - step_size * m / denom, {"m": m, "v": v}


def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> float:
    """Scale gradients in place so their global L2 norm is at most ``max_norm``;
    returns the norm before clipping (realizes the gradients)."""
    ps = [p for p in params if p.grad is not None]
    realize(*(p.grad for p in ps if p.grad is not None))
    total = math.sqrt(sum(float(np.sum(np.square(p.grad.numpy(), dtype=np.float64)))
                          for p in ps if p.grad is not None))
    if total > max_norm:
        scale = max_norm / (total + 1e-6)
        for p in ps:
            assert p.grad is not None
            p.grad = Tensor.from_array((p.grad.numpy() * scale).astype(p.dtype.np))
    return total
