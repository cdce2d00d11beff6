"""Learning-rate schedules, PyTorch's classes and their ``step()`` contract.

Constructing a scheduler records each group's ``initial_lr`` (the base) and sets the
epoch-0 rate; each ``sched.step()`` (once per epoch or per batch, as you choose) advances
``last_epoch`` by one and writes the new rate into ``optimizer.param_groups[i]["lr"]``.
Rates are closed forms of ``(base, last_epoch)``, so a schedule resumed from
``state_dict()`` continues exactly. The rate reaches the step's graph as a host input:
changing it never recompiles.

Warm-up: ``LinearLR(opt, start_factor=0.1, total_iters=5)`` alone, or chained before a
decay with ``SequentialLR(opt, [warmup, cosine], milestones=[5])``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any

from triplane.sdk.optim.base import Optimizer

Lambda = Callable[[int], float]

__all__ = ["CosineAnnealingLR", "LRScheduler", "LambdaLR", "LinearLR", "SequentialLR", "StepLR"]


class LRScheduler:
    """Base class: subclasses define ``_rate(group_index, base_lr, epoch)``."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} needs an Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for g in optimizer.param_groups:
                g.setdefault("initial_lr", g["lr"])
        elif any("initial_lr" not in g for g in optimizer.param_groups):
            raise KeyError(f"{type(self).__name__}: last_epoch={last_epoch} resumes a schedule, but "
                           "the optimizer's groups have no 'initial_lr' (load its state_dict first)")
        self.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr: list[float] = []
        self.step()

    def _rate(self, i: int, base: float, epoch: int) -> float:
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        """The rates of the current ``last_epoch``, one per parameter group."""
        return [self._rate(i, b, self.last_epoch) for i, b in enumerate(self.base_lrs)]

    def get_last_lr(self) -> list[float]:
        """The rates the last ``step()`` (or the constructor) set, one per group."""
        return list(self._last_lr)

    def step(self) -> None:
        self.last_epoch += 1
        self._last_lr = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr

    _SKIP = ("optimizer",)

    def state_dict(self) -> dict[str, Any]:
        """The schedule's plain attributes (not the optimizer, nor functions)."""
        return {k: v for k, v in vars(self).items() if k not in self._SKIP and not callable(v)
                and not (isinstance(v, list) and v and callable(v[0]))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a schedule saved by :meth:`state_dict`; the optimizer's rates become the
        saved schedule's last ones at once."""
        self.__dict__.update({k: v for k, v in state.items() if k not in self._SKIP})
        self.base_lrs = [float(b) for b in self.base_lrs]
        self.last_epoch = int(self.last_epoch)
        self._last_lr = [float(x) for x in self._last_lr]
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr


class StepLR(LRScheduler):
    """``base * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        if int(step_size) < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def _rate(self, i: int, base: float, epoch: int) -> float:
        return base * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2`` (rising again after
    ``T_max``, as PyTorch's does)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if int(T_max) < 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def _rate(self, i: int, base: float, epoch: int) -> float:
        return self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """``base * factor`` with factor going linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` steps, then staying (a linear warm-up)."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not (0 < start_factor <= 1 and 0 <= end_factor <= 1) or int(total_iters) < 1:
            raise ValueError(f"LinearLR: need 0 < start_factor <= 1, 0 <= end_factor <= 1, total_iters >= 1 "
                             f"(got {start_factor}, {end_factor}, {total_iters})")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = int(total_iters)
        super().__init__(optimizer, last_epoch)

    def _rate(self, i: int, base: float, epoch: int) -> float:
        frac = min(epoch, self.total_iters) / self.total_iters
        return base * (self.start_factor + (self.end_factor - self.start_factor) * frac)


class LambdaLR(LRScheduler):
    """``base * lr_lambda(epoch)`` (one function, or one per group)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Lambda | Sequence[Lambda],
                 last_epoch: int = -1) -> None:
        n = len(optimizer.param_groups)
        fns = list(lr_lambda) if isinstance(lr_lambda, Sequence) else [lr_lambda] * n
        if len(fns) != n:
            raise ValueError(f"LambdaLR: {len(fns)} functions for {n} parameter groups")
        self.lr_lambdas = fns
        super().__init__(optimizer, last_epoch)

    def _rate(self, i: int, base: float, epoch: int) -> float:
        return base * float(self.lr_lambdas[i](epoch))


class SequentialLR(LRScheduler):
    """``schedulers[k]`` from epoch ``milestones[k-1]`` on, its own epoch counted from
    there (so a decay after a warm-up starts at the base rate)."""

    _SKIP = ("optimizer", "schedulers")

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        if len(milestones) != len(schedulers) - 1 or list(milestones) != sorted(milestones):
            raise ValueError(f"SequentialLR: need len(schedulers) - 1 increasing milestones, got "
                             f"{len(schedulers)} schedulers and milestones {list(milestones)}")
        for s in schedulers:
            if s.optimizer is not optimizer:
                raise ValueError("SequentialLR: every scheduler must drive the same optimizer")
        self.schedulers, self.milestones = list(schedulers), [int(m) for m in milestones]
        # the sub-schedulers' constructors stepped the rates; start again from the base
        for g in optimizer.param_groups:
            g["lr"] = g["initial_lr"]
        super().__init__(optimizer, last_epoch)

    def _rate(self, i: int, base: float, epoch: int) -> float:
        k = bisect.bisect_right(self.milestones, epoch)
        start = self.milestones[k - 1] if k else 0
        return self.schedulers[k]._rate(i, base, epoch - start)
