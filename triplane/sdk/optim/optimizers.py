"""The optimisers, with PyTorch's update rules (``torch.optim``'s defaults and argument
names). Each docstring states the rule for gradient ``g`` of parameter ``p`` at its
``t``-th step; ``weight_decay`` (``wd``) is L2 added to the gradient except in AdamW,
where it is decoupled. State tensors live in ``opt.state[i]`` under PyTorch's names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from triplane.proto import optable
from triplane.proto.ir import Attrs, TensorType
from triplane.sdk.elementwise import maximum, sqrt
from triplane.sdk.optim.base import Optimizer
from triplane.sdk.tensor import Tensor, _user_line, apply, record_hooks, scalar

__all__ = ["SGD", "Adam", "AdamW", "RMSProp", "RMSprop"]

Update = tuple[Tensor, dict[str, Tensor]]


# (value's bits, dtype name) -> a lazy 0-d ``full`` tensor: the constants of an update rule
# (betas, eps) are recorded once and read by every step's graph, not made again per step.
_CONSTANTS: dict[tuple[str, str], Tensor] = {}


def _const(value: float, like: Tensor) -> Tensor:
    """``value`` as a 0-d constant of ``like``'s dtype, as ``value * like`` would make it."""
    key = (float(value).hex(), like.dtype.name)
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) >= 1024:
            _CONSTANTS.clear()
        t = _CONSTANTS[key] = scalar(float(value), like.dtype)
    return t


# (op, input shapes and dtypes) -> (the OpDef, attributes and type ``apply`` gave): an
# update rule records the same ops on the same types every step.
_RECORDED: dict[tuple[Any, ...], tuple[Any, Attrs, TensorType]] = {}


def _op(op: str, *xs: Tensor, where: str | None) -> Tensor:
    """``op`` of tensors of one floating dtype: the node its operator would record (``x *
    y``, ``tp.sqrt(x)``: no promotion or cast is needed). The first time for these types
    ``apply`` records it, with every check; after that the node is made with the type it
    inferred, naming ``where`` (the user's line of the step) as ``apply`` would."""
    key = (op, *[(x._type.shape, x._type.dtype.name) for x in xs])
    found = _RECORDED.get(key)
    opdef = optable.get(op)
    if found is None or found[0] is not opdef:
        if len({x.dtype.name for x in xs}) != 1 or not xs[0].dtype.is_float:
            raise AssertionError(f"{op} of {[x.dtype.name for x in xs]}")
        t = apply(op, xs)
        if len(_RECORDED) >= 4096:
            _RECORDED.clear()
        _RECORDED[key] = (opdef, t._attrs, t._type)
        return t
    out = Tensor(op, xs, found[1], found[2], where=where)
    for hook in record_hooks:
        hook(out)
    return out


def _where() -> str | None:
    """The user's line that called the optimiser (the caller's caller is inside it)."""
    return _user_line()


def _need(name: str, ok: bool, what: str, group: dict[str, Any]) -> None:
    if not ok:
        shown = ", ".join(f"{k}={v}" for k, v in group.items() if k != "params")
        raise ValueError(f"{name}: need {what} (got {shown})")


class SGD(Optimizer):
    """Stochastic gradient descent::

        g = g + wd * p
        buf = g (first step) else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf (nesterov) else buf        (only with momentum)
        p = p - lr * g
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.01, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 l1: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov, "l1": l1})

    def _check(self, group: dict[str, Any]) -> None:
        super()._check(group)
        _need("SGD", group["lr"] > 0 and group["momentum"] >= 0 and group["weight_decay"] >= 0,
              "lr > 0, momentum >= 0, weight_decay >= 0", group)
        _need("SGD", not group["nesterov"] or (group["momentum"] > 0 and group["dampening"] == 0),
              "momentum > 0 and dampening == 0 for nesterov", group)

    def _update(self, i: int, p: Tensor, g: Tensor, group: dict[str, Any], t: int) -> Update:
        mom, wd = group["momentum"], group["weight_decay"]
        if wd:
            g = g + wd * p
        state: dict[str, Tensor] = {}
        if mom:
            buf = self.state[i].get("momentum_buffer")
            buf = g if buf is None else mom * buf + (1 - group["dampening"]) * g
            state["momentum_buffer"] = buf
            g = g + mom * buf if group["nesterov"] else buf
        return p - self._scalar(group["lr"], p) * g, state


class Adam(Optimizer):
    """Adam (Kingma & Ba)::

        g = g + wd * p
        m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g * g     (m = v = 0 at first)
        v_max = max(v_max, v) and used for v (amsgrad)
        p = p - lr / (1 - b1**t) * m / (sqrt(v / (1 - b2**t)) + eps)
    """

    _decoupled = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 l1: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "amsgrad": amsgrad, "l1": l1})

    def _check(self, group: dict[str, Any]) -> None:
        super()._check(group)
        b1, b2 = group["betas"]
        _need(type(self).__name__, group["lr"] > 0 and 0 <= b1 < 1 and 0 <= b2 < 1 and group["eps"] >= 0
              and group["weight_decay"] >= 0, "lr > 0, 0 <= betas < 1, eps >= 0, weight_decay >= 0", group)

    def _update(self, i: int, p: Tensor, g: Tensor, group: dict[str, Any], t: int) -> Update:
        # The nodes ``b1 * m + (1 - b1) * g`` etc. would record (p, g and the state share
        # p's dtype), recorded directly: this rule is most of a small model's step.
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if wd and self._decoupled:
            p = p * (1 - self._scalar(lr * wd, p))
        elif wd:
            g = g + wd * p
        st = self.state[i]
        at = _where()
        m = _op("mul", _const(1 - b1, g), g, where=at)
        if "exp_avg" in st:
            m = _op("add", _op("mul", _const(b1, g), st["exp_avg"], where=at), m, where=at)
        v = _op("mul", _const(1 - b2, g), _op("mul", g, g, where=at), where=at)
        if "exp_avg_sq" in st:
            v = _op("add", _op("mul", _const(b2, g), st["exp_avg_sq"], where=at), v, where=at)
        state = {"exp_avg": m, "exp_avg_sq": v}
        if group["amsgrad"]:
            v = v if "max_exp_avg_sq" not in st else maximum(st["max_exp_avg_sq"], v)
            state["max_exp_avg_sq"] = v
        step_size = self._step_scalar(lr / (1 - b1**t), p)
        scaled = _op("mul", v, self._step_scalar(1.0 / (1 - b2**t), p), where=at)
        denom = _op("add", _op("sqrt", scaled, where=at), _const(group["eps"], p), where=at)
        return _op("sub", p, _op("div", _op("mul", step_size, m, where=at), denom, where=at),
                   where=at), state

    def _step_scalar(self, value: float, like: Tensor) -> Tensor:
        """``self._scalar(value, like)``, one host input per value and dtype in a step (the
        bias corrections of parameters at the same step count are one input, not one each)."""
        key = (float(value).hex(), like.dtype.name)
        if getattr(self, "_scalars_of", None) != self.steps:
            self._scalars_of, self._scalars = self.steps, {}
        found = self._scalars.get(key)
        if found is None:
            found = self._scalars[key] = self._scalar(value, like)
        return found


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): first
    ``p = p * (1 - lr * wd)``, then Adam's update without ``wd`` in the gradient.
    PyTorch's default ``weight_decay=0.01``."""

    _decoupled = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, amsgrad: bool = False,
                 l1: float = 0.0) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, l1)


class RMSprop(Optimizer):
    """RMSprop (Hinton), PyTorch's rule (square_avg, grad_avg, buf start at 0)::

        g = g + wd * p
        square_avg = alpha * square_avg + (1 - alpha) * g * g
        avg = sqrt(square_avg - grad_avg**2) + eps, with grad_avg = alpha * grad_avg + (1 - alpha) * g
              (centered) else sqrt(square_avg) + eps
        buf = momentum * buf + g / avg;  p = p - lr * buf     (momentum > 0)
        p = p - lr * g / avg                                  (otherwise)
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.01, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 l1: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay,
                                  "momentum": momentum, "centered": centered, "l1": l1})

    def _check(self, group: dict[str, Any]) -> None:
        super()._check(group)
        _need("RMSprop", group["lr"] > 0 and 0 <= group["alpha"] < 1 and group["eps"] >= 0
              and group["weight_decay"] >= 0 and group["momentum"] >= 0,
              "lr > 0, 0 <= alpha < 1, eps >= 0, weight_decay >= 0, momentum >= 0", group)

    def _update(self, i: int, p: Tensor, g: Tensor, group: dict[str, Any], t: int) -> Update:
        alpha, mom, wd = group["alpha"], group["momentum"], group["weight_decay"]
        if wd:
            g = g + wd * p
        st = self.state[i]
        g2 = g * g
        sq = (1 - alpha) * g2 if "square_avg" not in st else alpha * st["square_avg"] + (1 - alpha) * g2
        state = {"square_avg": sq}
        if group["centered"]:
            ga = (1 - alpha) * g if "grad_avg" not in st else alpha * st["grad_avg"] + (1 - alpha) * g
            state["grad_avg"] = ga
            avg = sqrt(sq - ga * ga) + group["eps"]
        else:
            avg = sqrt(sq) + group["eps"]
        lr = self._scalar(group["lr"], p)
        if mom:
            buf = g / avg if "momentum_buffer" not in st else mom * st["momentum_buffer"] + g / avg
            state["momentum_buffer"] = buf
            return p - lr * buf, state
        return p - lr * (g / avg), state


RMSProp = RMSprop  # the spelling of the issue; PyTorch's class is RMSprop
