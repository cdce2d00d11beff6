"""nn modules, torch-like and small: ``Module``, ``Parameter`` and the usual layers.

A :class:`Module` finds its parameters by walking its attributes (parameters, modules,
and lists/tuples/dicts of them), so ``self.fc = Linear(4, 8)`` is all it takes. Buffers
(tensors saved with the model but not trained, e.g. BatchNorm's running statistics) are
declared with :meth:`Module.register_buffer`.

Initialisation draws from ``numpy.random.default_rng(seed)`` where ``seed`` comes from
the SDK's seed stream, so after ``tp.manual_seed(s)`` building the same model gives the
same parameters.

``state_dict()`` is a plain ``{name: numpy array}`` (save it with ``tp.save(sd, "m.npz")``;
model files never use pickle) and ``load_state_dict`` checks names, shapes and dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.sdk.tensor import Tensor

__all__ = [
    "AvgPool2d", "BatchNorm2d", "Conv2d", "Dropout", "Embedding", "Flatten", "GELU", "LayerNorm",
    "Linear", "MaxPool2d", "Module", "Parameter", "ReLU", "Sequential", "Sigmoid", "Tanh",
]


def _init_rng() -> np.random.Generator:
    """A generator for one module's initialisation, seeded from the SDK's seed stream."""
    # creation's stream is the one tp.manual_seed restarts.
    from triplane.sdk.creation import next_seed

    return np.random.default_rng(next_seed())


def _pair(v: int | Sequence[int], what: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(x, int) for x in t):
        raise ValueError(f"{what} must be an int or a pair of ints, got {v!r}")
    return (int(t[0]), int(t[1]))


class Parameter(Tensor):
    """A trainable leaf tensor (``requires_grad=True``) holding ``value``."""

    __slots__ = ()

    def __init__(self, value: Any, dtype: Any = None) -> None:
        t = Tensor.from_array(value.numpy() if isinstance(value, Tensor) else value, dtype)
        if not t.dtype.is_float:
            raise TypeError(f"parameters must be floating point, not {t.dtype.name}")
        super().__init__("input", (), t._attrs, t._type, value=t._value)
        self.requires_grad = True

    @classmethod
    def from_array(cls, value: Any, dtype: Any = None, requires_grad: bool = True) -> Parameter:
        return cls(value, dtype)

    def __repr__(self) -> str:
        return f"Parameter(shape={list(self.shape)}, dtype={self.dtype.name})"


class Module:
    """Base class of layers and models: subclass it and define ``forward``."""

    def __init__(self) -> None:
        self.training = True
        self._buffers: dict[str, Tensor] = {}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # --- walking the tree --------------------------------------------------------------

    def _children(self) -> Iterator[tuple[str, Any]]:
        for name, v in vars(self).items():
            if name.startswith("_") or name == "training":
                continue
            if isinstance(v, (Parameter, Module)):
                yield name, v
            elif isinstance(v, (list, tuple)):
                yield from ((f"{name}.{i}", x) for i, x in enumerate(v) if isinstance(x, (Parameter, Module)))
            elif isinstance(v, dict):
                yield from ((f"{name}.{k}", x) for k, x in v.items() if isinstance(x, (Parameter, Module)))

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, v in self._children():
            if isinstance(v, Module):
                yield from v.named_modules(f"{prefix}{name}.")

    def modules(self) -> Iterator[Module]:
        return (m for _, m in self.named_modules())

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs, each parameter once, in definition order."""
        seen: set[int] = set()
        for mprefix, m in self.named_modules(prefix):
            for name, v in m._children():
                if isinstance(v, Parameter) and id(v) not in seen:
                    seen.add(id(v))
                    yield f"{mprefix}{name}", v

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def register_buffer(self, name: str, value: Any) -> Tensor:
        """A non-trainable tensor saved in the state dict, reachable as ``self.<name>``."""
        t = value if isinstance(value, Tensor) else Tensor.from_array(np.asarray(value))
        self._buffers[name] = t
        object.__setattr__(self, name, t)
        return t

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for mprefix, m in self.named_modules(prefix):
            for name, t in m._buffers.items():
                yield f"{mprefix}{name}", t

    # --- modes and gradients -----------------------------------------------------------

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    # --- saving ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter and buffer value, by dotted name."""
        out = {name: np.array(p.numpy()) for name, p in self.named_parameters()}
        out.update((name, np.array(b.numpy())) for name, b in self.named_buffers())
        return out

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Assign values by name. With ``strict``, missing or unexpected names are an error;
        a shape or dtype mismatch always is (nothing is assigned then)."""
        targets: dict[str, Tensor] = dict(self.named_parameters())
        targets.update(self.named_buffers())
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if strict and (missing or unexpected):
            raise KeyError(f"{type(self).__name__}.load_state_dict (strict): missing {missing}, "
                           f"unexpected {unexpected} (strict=False loads the names that match)")
        checked: list[tuple[Tensor, np.ndarray]] = []
        for name, t in targets.items():
            if name not in state:
                continue
            arr = np.asarray(state[name])
            if arr.shape != t.shape:
                raise ValueError(f"load_state_dict: {name!r} has shape {list(arr.shape)}, "
                                 f"the model's is {list(t.shape)}")
            if dt.dtype(arr.dtype) != t.dtype:
                raise ValueError(f"load_state_dict: {name!r} has dtype {arr.dtype}, "
                                 f"the model's is {t.dtype.name}")
            checked.append((t, arr))
        for t, arr in checked:
            t.assign(arr)

    def __repr__(self) -> str:
        kids = [f"  ({n}): {m!r}".replace("\n", "\n  ") for n, m in self._children() if isinstance(m, Module)]
        extra = self.extra_repr()
        if not kids:
            return f"{type(self).__name__}({extra})"
        return f"{type(self).__name__}({extra}\n" + "\n".join(kids) + "\n)"

    def extra_repr(self) -> str:
        return ""


def _uniform(rng: np.random.Generator, bound: float, shape: tuple[int, ...], dtype: Any) -> Parameter:
    return Parameter(rng.uniform(-bound, bound, size=shape).astype(dt.dtype(dtype).np))


class Linear(Module):
    """``y = x @ weight.T + bias``; weight (out, in). torch's init: weight and bias
    uniform in +-1/sqrt(in_features) (Kaiming-uniform with a = sqrt(5))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: Any = "float32") -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        rng = _init_rng()
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform(rng, bound, (out_features, in_features), dtype)
        self.bias = _uniform(rng, bound, (out_features,), dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight.T
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """2-d convolution over NCHW input; weight (out, in/groups, kh, kw), torch's init."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                 dilation: int | Sequence[int] = 1, groups: int = 1, bias: bool = True,
                 dtype: Any = "float32") -> None:
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: groups={groups} must divide in_channels={in_channels} "
                             f"and out_channels={out_channels}")
        kh, kw = _pair(kernel_size, "kernel_size")
        self.stride, self.padding = _pair(stride, "stride"), _pair(padding, "padding")
        self.dilation, self.groups = _pair(dilation, "dilation"), groups
        rng = _init_rng()
        fan_in = in_channels // groups * kh * kw
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = _uniform(rng, bound, (out_channels, in_channels // groups, kh, kw), dtype)
        self.bias = _uniform(rng, bound, (out_channels,), dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        from triplane.sdk.nn import functional as F

        return F.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups)

    def extra_repr(self) -> str:
        o, i, kh, kw = self.weight.shape
        return (f"{i * self.groups}, {o}, kernel_size=({kh}, {kw}), stride={self.stride}, "
                f"padding={self.padding}")


class _Pool2d(Module):
    _fn = ""

    def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride")
        self.padding = _pair(padding, "padding")

    def forward(self, x: Tensor) -> Tensor:
        from triplane.sdk.nn import functional as F

        return getattr(F, self._fn)(x, self.kernel_size, stride=self.stride, padding=self.padding)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    _fn = "max_pool2d"


class AvgPool2d(_Pool2d):
    _fn = "avg_pool2d"


class _Activation(Module):
    _fn = ""

    def forward(self, x: Tensor) -> Tensor:
        import triplane.sdk.elementwise as ew

        return getattr(ew, self._fn)(x)


class ReLU(_Activation):
    _fn = "relu"


class GELU(_Activation):
    _fn = "gelu"


class Tanh(_Activation):
    _fn = "tanh"


class Sigmoid(_Activation):
    _fn = "sigmoid"


class Flatten(Module):
    """Dimensions from ``start_dim`` on become one (the batch dimension stays)."""

    def __init__(self, start_dim: int = 1) -> None:
        super().__init__()
        self.start_dim = start_dim

    def forward(self, x: Tensor) -> Tensor:
        s = self.start_dim % max(x.ndim, 1)
        return x.reshape((*x.shape[:s], math.prod(x.shape[s:])))


class Sequential(Module):
    """Modules applied in order; ``seq[i]`` is the i-th."""

    def __init__(self, *layers: Module) -> None:
        super().__init__()
        for i, m in enumerate(layers):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: argument {i} is a {type(m).__name__}, not a Module")
        self.layers = list(layers)

    def _children(self) -> Iterator[tuple[str, Any]]:
        # torch's naming ("0.weight"), so state dicts read the same
        return ((str(i), m) for i, m in enumerate(self.layers))

    def __getitem__(self, i: int) -> Module:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def forward(self, x: Any) -> Any:
        for m in self.layers:
            x = m(x)
        return x


class Dropout(Module):
    """Zeroes elements with probability ``p`` in training (scaling the rest by 1/(1-p));
    the identity in eval mode. The mask's seed advances every call: masks differ from
    step to step, and a run repeats exactly after the same ``tp.manual_seed``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = p
        self._seed = int(_init_rng().integers(0, 2**52))  # seeds must stay below 2**53 (JSON)
        self._calls = 0

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        from triplane.sdk.nn import functional as F

        self._calls += 1
        return F.dropout(x, self.p, True, seed=self._seed + self._calls)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerNorm(Module):
    """Normalise over the last ``len(normalized_shape)`` dimensions; weight 1, bias 0."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5,
                 elementwise_affine: bool = True, dtype: Any = "float32") -> None:
        super().__init__()
        self.normalized_shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                                 else tuple(normalized_shape))
        self.eps = eps
        d = dt.dtype(dtype).np
        self.weight = Parameter(np.ones(self.normalized_shape, d)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, d)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        from triplane.sdk.nn import functional as F

        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class BatchNorm2d(Module):
    """Batch normalisation over (N, H, W) per channel of NCHW input.

    Training: normalise with the batch's statistics and schedule the running-statistics
    update ``running = (1 - momentum) * running + momentum * batch`` (unbiased variance,
    as torch). The update is realized together with the next optimizer ``step()`` in its
    one graph run (or by :func:`triplane.sdk.optim.flush_pending_updates`); if several
    forwards happen before a step, the last one's statistics are used.
    Eval: normalise with the running statistics.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, dtype: Any = "float32") -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        d = dt.dtype(dtype).np
        self.weight = Parameter(np.ones(num_features, d)) if affine else None
        self.bias = Parameter(np.zeros(num_features, d)) if affine else None
        self.register_buffer("running_mean", np.zeros(num_features, d))
        self.register_buffer("running_var", np.ones(num_features, d))

    def forward(self, x: Tensor) -> Tensor:
        from triplane.sdk.nn import functional as F
        from triplane.sdk.optim import add_pending_update

        if x.ndim != 4 or x.shape[1] != self.num_features:
            from triplane.proto.errors import ShapeError

            raise ShapeError(f"BatchNorm2d({self.num_features}) needs input (N, {self.num_features}, H, W), "
                             f"got {x.shape}")
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                training=False, eps=self.eps)
        y, new_mean, new_var = F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                            self.bias, training=True, momentum=self.momentum, eps=self.eps)
        add_pending_update(self.running_mean, new_mean)
        add_pending_update(self.running_var, new_var)
        return y

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) by integer index; N(0, 1) init."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: Any = "float32") -> None:
        super().__init__()
        self.weight = Parameter(_init_rng().standard_normal((num_embeddings, embedding_dim))
                                .astype(dt.dtype(dtype).np))

    def forward(self, indices: Tensor) -> Tensor:
        from triplane.sdk.nn import functional as F

        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"
