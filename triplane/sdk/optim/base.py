"""The optimiser contract: :class:`Optimizer` (parameter groups, one-graph-run steps,
``state_dict``), the pending-update queue modules use, and :func:`clip_grad_norm`.

Contract of :meth:`Optimizer.step`: the update of every parameter that has a gradient
is built lazily and computed in ONE graph run (:func:`triplane.realize` of all new
values and new state together), then written with :meth:`Tensor.assign`. Parameters
whose ``.grad`` is None are left alone (their step count does not advance). Optimizer
state (momentum, moments) is kept as realized tensors with no history, so graphs never
grow step after step.

Parameters change in place, so a lazy tensor that reads them and is not computed yet
would see the new values afterwards. The step therefore realizes, in the same run, the
gradients, every output ``backward()`` was called on since the last step (so
``loss.backward(); opt.step(); loss.item()`` reads this step's loss, as in PyTorch) and
any tensors passed as ``step(*also)``.

Values that change from step to step (the learning rate a scheduler sets, Adam's bias
corrections) enter the graph as host inputs, not as attributes, so every step's graph
hashes the same and the compiled plan is reused.

Modules may hold pending updates that must be realized together with the step (e.g.
BatchNorm running statistics); they register them with :func:`add_pending_update`, and
``step()`` realizes and assigns them in the same graph run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from triplane.sdk.tensor import Tensor, realize

__all__ = ["Optimizer", "add_pending_update", "clip_grad_norm", "flush_pending_updates"]

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
    realize(*also, keep=[v for _, v in pending])
    for target, value in pending:
        target.assign(value)


class Optimizer:
    """Base class: parameter groups, per-parameter state and the one-run step.

    ``params`` is an iterable of Tensors or, as in PyTorch, of dicts
    ``{"params": [...], "lr": ...}`` whose other keys override the defaults for that
    group. ``param_groups[i]["lr"]`` may be changed between steps (schedulers do).
    Every optimiser also takes ``l1`` (add ``l1 * sign(p)`` to the gradient: the
    subgradient of an L1 penalty ``l1 * sum |p|``); ``weight_decay`` is L2.
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], Mapping):
            groups = [{"params": groups}]
        self.defaults = {"l1": 0.0, **defaults}
        self.param_groups: list[dict[str, Any]] = []
        self.params: list[Tensor] = []
        self._index: dict[int, int] = {}
        for g in groups:
            self.add_param_group(g)
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        self.steps = 0

    def add_param_group(self, group: Mapping[str, Any]) -> None:
        if not isinstance(group, Mapping) or "params" not in group:
            raise TypeError(f"{type(self).__name__}: a parameter group is a dict with 'params', "
                            f"got {type(group).__name__}")
        ps = group["params"]
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        unknown = sorted(set(group) - set(self.defaults) - {"params", "initial_lr"})
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown option(s) {unknown} in a parameter group "
                            f"(known: {sorted(self.defaults)})")
        for p in ps:
            i = len(self.params)
            if not isinstance(p, Tensor):
                raise TypeError(f"parameter {i} is a {type(p).__name__}, not a Tensor")
            if not p.dtype.is_float:
                raise TypeError(f"parameter {i} has dtype {p.dtype.name}; only floats can be optimized")
            if id(p) in self._index:
                raise ValueError(f"parameter {i} appears twice in {type(self).__name__}'s parameters")
            self._index[id(p)] = i
            self.params.append(p)
        full = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}}
        self._check(full)
        if getattr(self, "state", None) is not None:
            self.state.extend({} for _ in ps)
        self.param_groups.append({"params": ps, **full})

    def _check(self, group: dict[str, Any]) -> None:
        """Raise ValueError for out-of-range hyperparameters of one group."""
        if group["l1"] < 0:
            raise ValueError(f"{type(self).__name__}: need l1 >= 0 (got {group['l1']})")

    # --- the legacy single-group attributes (``opt.lr = ...``) -------------------------

    @property
    def lr(self) -> float:
        return float(self.param_groups[0]["lr"])

    @lr.setter
    def lr(self, value: float) -> None:
        for g in self.param_groups:
            g["lr"] = value

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (``backward`` accumulates into ``.grad``): None, or zeros
        with ``set_to_none=False`` (then every parameter takes a step, as in PyTorch)."""
        for p in self.params:
            p.grad = None if set_to_none else Tensor.from_array(np.zeros(p.shape, p.dtype.np))

    def _update(self, i: int, p: Tensor, g: Tensor, group: dict[str, Any], t: int
                ) -> tuple[Tensor, dict[str, Tensor]]:
        """The lazy new value of parameter ``i`` (its ``t``-th step) and its new state."""
        raise NotImplementedError

    def _scalar(self, value: float, like: Tensor) -> Tensor:
        # A host input (not an attribute) so step-dependent values keep the graph's hash.
        return Tensor.from_array(np.asarray(value, dtype=like.dtype.np))

    def step(self, *also: Tensor) -> None:
        """Apply one update to every parameter with a gradient, in one graph run (see
        the module docstring for what else that run computes)."""
        from triplane.sdk.autograd import take_backward_outputs
        from triplane.sdk.elementwise import sign

        self.steps += 1
        grads: list[Tensor] = []
        jobs: list[tuple[int, Tensor, dict[str, Tensor], int]] = []
        for group in self.param_groups:
            for p in group["params"]:
                i = self._index[id(p)]
                if p.grad is None:
                    continue
                g = p.grad
                if g.shape != p.shape:
                    raise ValueError(f"parameter {i}: gradient shape {list(g.shape)} != {list(p.shape)}")
                grads.append(g)
                if g.dtype != p.dtype:
                    g = g.astype(p.dtype)
                if group["l1"]:
                    g = g + group["l1"] * sign(p)
                t = int(self.state[i].get("step", 0)) + 1
                new, state = self._update(i, p, g, group, t)
                jobs.append((i, new, state, t))
        pending = list(_PENDING)
        _PENDING.clear()
        # On a cluster, new parameters, state and gradients stay there (read when read).
        realize(*also, *take_backward_outputs(), keep=[
            *grads, *(x for _, new, st, _ in jobs for x in (new, *st.values())), *(v for _, v in pending)])
        for i, new, state, t in jobs:
            self.params[i].assign(new)
            old = self.state[i]  # the same state Tensors step after step (checkpoints track them)
            self.state[i] = {"step": t, **{k: _into(old.get(k), v) for k, v in state.items()}}
        for target, value in pending:
            target.assign(value)

    # --- saving --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout with numpy values: ``{"state": {index: {name: array or int}},
        "param_groups": [{hyperparameters..., "params": [indices]}]}`` (savable with
        :func:`triplane.save`)."""
        state = {i: {k: (np.array(v.numpy()) if isinstance(v, Tensor) else v) for k, v in st.items()}
                 for i, st in enumerate(self.state) if st}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [self._index[id(p)] for p in g["params"]]} for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore hyperparameters and state saved by :meth:`state_dict` from an optimiser
        over parameters of the same shapes in the same order; nothing changes on error."""
        name = type(self).__name__
        if set(state_dict) != {"state", "param_groups"}:
            raise ValueError(f"{name}.load_state_dict: expected keys ['param_groups', 'state'], "
                             f"got {sorted(state_dict)}")
        groups = list(state_dict["param_groups"])
        sizes = [len(g["params"]) for g in self.param_groups]
        saved = [len(g["params"]) for g in groups]
        if sizes != saved:
            raise ValueError(f"{name}.load_state_dict: saved parameter groups have sizes {saved}, "
                             f"this optimiser's have {sizes}")
        new_state: list[dict[str, Any]] = [{} for _ in self.params]
        for key, st in dict(state_dict["state"]).items():
            i = int(key)
            if not 0 <= i < len(self.params):
                raise ValueError(f"{name}.load_state_dict: state for parameter {i}, but there are "
                                 f"{len(self.params)}")
            p = self.params[i]
            for k, v in st.items():
                if k == "step":
                    new_state[i][k] = int(v)
                    continue
                arr = np.asarray(v)
                if arr.shape != p.shape:
                    raise ValueError(f"{name}.load_state_dict: state {k!r} of parameter {i} has shape "
                                     f"{list(arr.shape)}, the parameter's is {list(p.shape)}")
                new_state[i][k] = Tensor.from_array(arr.astype(p.dtype.np))
        for sg in groups:
            extra = sorted(set(sg) - set(self.defaults) - {"params", "initial_lr"})
            if extra:
                raise ValueError(f"{name}.load_state_dict: unknown option(s) {extra} in a saved group")
        for g, sg in zip(self.param_groups, groups):
            g.update({k: v for k, v in sg.items() if k != "params"})
        self.state = new_state
        self.steps = max((int(s.get("step", 0)) for s in new_state), default=0)


def _into(slot: Any, value: Tensor) -> Tensor:
    """``slot`` (a state Tensor of the last step) holding ``value`` now, or a new leaf."""
    if isinstance(slot, Tensor) and slot.is_leaf and slot.shape == value.shape and slot.dtype == value.dtype:
        return slot.assign(value)
    return value.detach()


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
