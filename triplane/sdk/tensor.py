"""The lazy Tensor.

A Tensor is a node of a graph being recorded: an op, input Tensors and attributes, with
its shape and dtype inferred (and so checked) the moment the line that makes it runs.
Nothing computes until ``.numpy()`` (or :func:`realize`) asks; then the graph up to the
asked tensors is compiled and run by the current session (in-process by default).

A realized tensor keeps its value, and later graphs read it as an input instead of
recomputing it; it also keeps its inputs, so gradients can still flow through it.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto import ir as _ir
from triplane.proto.errors import GraphError
from triplane.proto.ir import Attrs, Graph, Node, TensorType
from triplane.sdk.inference import infer

_ids = itertools.count()


class _Unset:
    """The default of an argument with two spellings (``axis``/``dim``): tells "not given"
    apart from None."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def spelling(op: str, numpy_name: str, numpy_value: Any, torch_name: str, torch_value: Any,
             default: Any) -> Any:
    """The value of an argument that has a numpy and a PyTorch spelling (``axis``/``dim``,
    ``keepdims``/``keepdim``): whichever was given (``default`` when neither was);
    TypeError when both were."""
    if numpy_value is not UNSET and torch_value is not UNSET:
        raise TypeError(f"{op}() got both {numpy_name}= and {torch_name}= (the same argument, "
                        f"numpy's and PyTorch's spellings); give one")
    if numpy_value is not UNSET:
        return numpy_value
    return default if torch_value is UNSET else torch_value
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_line() -> str | None:
    """file:line of the innermost frame outside the triplane package (the user's line)."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return None


class Tensor:
    """A lazily computed n-dimensional array.

    Build them with :func:`triplane.tensor`, the creation functions and ops; read them
    with :meth:`numpy` / :meth:`item` (or ``float(t)``, ``int(t)``, ``bool(t)`` of one
    element). Arithmetic follows numpy 2 (broadcasting, NEP 50 dtype promotion: Python
    scalars are weak; ``/`` is true division, ``//`` and ``%`` round down).
    """

    __slots__ = ("__weakref__", "_attrs", "_id", "_inputs", "_op", "_type", "_value", "_where",
                 "grad", "requires_grad")
    __array_priority__ = 1000  # so ndarray + Tensor defers to Tensor.__radd__

    def __init__(self, op: str, inputs: Sequence[Tensor], attrs: Attrs, type_: TensorType,
                 value: np.ndarray | RemoteValue | None = None, where: str | None = None) -> None:
        self._id = f"t{next(_ids)}"
        self._op = op
        self._inputs = tuple(inputs)
        self._attrs = attrs
        self._type = type_
        self._value = value
        self._where = where
        self.requires_grad = False
        self.grad: Tensor | None = None

    # --- static facts -----------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self._type.shape

    @property
    def dtype(self) -> dt.DType:
        return self._type.dtype

    @property
    def ndim(self) -> int:
        return len(self._type.shape)

    @property
    def size(self) -> int:
        return self._type.size

    @property
    def nbytes(self) -> int:
        return self._type.nbytes

    @property
    def op(self) -> str:
        return self._op

    @property
    def is_leaf(self) -> bool:
        return not self._inputs

    def __len__(self) -> int:
        """The size of the first dimension (numpy's and PyTorch's len); TypeError for 0-d."""
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        state = "realized" if self._value is not None else "lazy"
        rg = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({self._op}, shape={list(self.shape)}, dtype={self.dtype.name}, {state}{rg})"

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {list(self.shape)} is ambiguous")
        return bool(self.numpy())

    def _one(self, to: str) -> Any:
        if self.size != 1:
            raise TypeError(f"only a tensor of one element converts to a Python {to}, this one "
                            f"has shape {list(self.shape)}")
        return self.numpy().reshape(()).item()

    def __float__(self) -> float:
        return float(self._one("float"))

    def __int__(self) -> int:
        return int(self._one("int"))

    # --- computing --------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """Compute (if needed) and return the value as a numpy array (a read-only view).
        A value kept on a cluster (a :class:`~triplane.sdk.remote_values.RemoteValue`) is
        fetched once and cached."""
        v = self._value
        if v is None:
            realize(self)
            v = self._value
        if type(v) is np.ndarray:
            return v
        assert v is not None
        return v.numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        v = self.numpy()
        return v.astype(dtype) if dtype is not None else v.copy()

    def item(self) -> float | int | bool:
        if self.size != 1:
            raise ValueError(f"item() needs a tensor of one element, this one has shape {list(self.shape)}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def detach(self) -> Tensor:
        """A tensor with the same value that gradients do not flow through (a value kept
        on a cluster stays there)."""
        if self._value is None:
            realize(self)
        return Tensor("input", (), Attrs(), self._type, value=self._value)._held()

    def backward(self, grad_output: Tensor | None = None) -> None:
        """Accumulate d self / d leaf into ``leaf.grad`` for every tensor created with
        ``requires_grad=True`` that self depends on."""
        from triplane.sdk.autograd import backward

        backward(self, grad_output)

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and not self.dtype.is_float:
            raise TypeError(f"only floating-point tensors can require gradients, not {self.dtype.name}")
        self.requires_grad = flag
        return self

    # --- leaves -----------------------------------------------------------------------

    @classmethod
    def from_array(cls, value: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
        arr = np.asarray(value)
        if dtype is not None:
            arr = arr.astype(dt.dtype(dtype).np, copy=False)
        elif arr.dtype == np.float64 and not isinstance(value, (np.ndarray, np.generic)):
            arr = arr.astype(np.float32)  # Python floats default to float32, as in torch
        elif arr.dtype.kind in "UO":
            raise TypeError(f"cannot make a tensor from {arr.dtype} data")
        d = dt.dtype(arr.dtype)
        arr = np.ascontiguousarray(arr).reshape(arr.shape)  # ascontiguousarray makes 0-d 1-d
        arr.flags.writeable = False
        t = cls("input", (), Attrs(), TensorType(arr.shape, d), value=arr)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def assign(self, value: Tensor | np.ndarray | RemoteValue) -> Tensor:
        """Replace this leaf's value in place (optimizers use this). Shape and dtype stay.
        A tensor's value kept on a cluster (or a RemoteValue) is taken as is, not fetched."""
        held = value._value if isinstance(value, Tensor) else value
        if isinstance(held, RemoteValue):
            if held.type != self._type:
                raise GraphError(f"assign: value of type {held.type} to a tensor of type {self._type}")
            self._op, self._inputs, self._attrs, self._value = "input", (), Attrs(), held
            return self._held()
        arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        if arr.shape != self.shape:
            raise GraphError(f"assign: value of shape {list(arr.shape)} to a tensor of shape "
                             f"{list(self.shape)}")
        arr = np.ascontiguousarray(arr.astype(self.dtype.np, copy=False)).reshape(self.shape)
        arr.flags.writeable = False
        self._op, self._inputs, self._attrs, self._value = "input", (), Attrs(), arr
        return self

    def _held(self) -> Tensor:
        """Tell the session of a value kept on a cluster that this tensor holds it (its
        checkpoints and ``tp.disconnect()`` find it there)."""
        v = self._value
        if isinstance(v, RemoteValue):
            v.session.holders.add(self)
        return self

    # --- operators (the functions live in the op-group modules) ------------------------

    def __add__(self, o: Any) -> Tensor:
        return _ew.add(self, o)

    def __radd__(self, o: Any) -> Tensor:
        return _ew.add(o, self)

    def __sub__(self, o: Any) -> Tensor:
        return _ew.sub(self, o)

    def __rsub__(self, o: Any) -> Tensor:
        return _ew.sub(o, self)

    def __mul__(self, o: Any) -> Tensor:
        return _ew.mul(self, o)

    def __rmul__(self, o: Any) -> Tensor:
        return _ew.mul(o, self)

    def __truediv__(self, o: Any) -> Tensor:
        return _ew.div(self, o)

    def __rtruediv__(self, o: Any) -> Tensor:
        return _ew.div(o, self)

    def __floordiv__(self, o: Any) -> Tensor:
        return _ew.floor_divide(self, o)

    def __rfloordiv__(self, o: Any) -> Tensor:
        return _ew.floor_divide(o, self)

    def __mod__(self, o: Any) -> Tensor:
        return _ew.remainder(self, o)

    def __rmod__(self, o: Any) -> Tensor:
        return _ew.remainder(o, self)

    def __pow__(self, o: Any) -> Tensor:
        return _ew.pow(self, o)

    def __rpow__(self, o: Any) -> Tensor:
        return _ew.pow(o, self)

    def __matmul__(self, o: Any) -> Tensor:
        return _la.matmul(self, o)

    def __rmatmul__(self, o: Any) -> Tensor:
        return _la.matmul(o, self)

    def __neg__(self) -> Tensor:
        return _ew.neg(self)

    def __abs__(self) -> Tensor:
        return _ew.abs(self)

    def __eq__(self, o: Any) -> Tensor:  # type: ignore[override]
        return _ew.eq(self, o)

    def __ne__(self, o: Any) -> Tensor:  # type: ignore[override]
        return _ew.ne(self, o)

    def __lt__(self, o: Any) -> Tensor:
        return _ew.lt(self, o)

    def __le__(self, o: Any) -> Tensor:
        return _ew.le(self, o)

    def __gt__(self, o: Any) -> Tensor:
        return _ew.gt(self, o)

    def __ge__(self, o: Any) -> Tensor:
        return _ew.ge(self, o)

    def __pos__(self) -> Tensor:
        return self

    def __and__(self, o: Any) -> Tensor:
        return _ew.bool_operator("logical_and", self, o)

    def __rand__(self, o: Any) -> Tensor:
        return _ew.bool_operator("logical_and", o, self)

    def __or__(self, o: Any) -> Tensor:
        return _ew.bool_operator("logical_or", self, o)

    def __ror__(self, o: Any) -> Tensor:
        return _ew.bool_operator("logical_or", o, self)

    def __invert__(self) -> Tensor:
        return _ew.bool_operator("logical_not", self)

    def __getitem__(self, index: Any) -> Tensor:
        return _sh.getitem(self, index)

    # --- methods ----------------------------------------------------------------------

    def astype(self, dtype: Any) -> Tensor:
        return _ew.cast(self, dtype)

    cast = astype

    def sum(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
            keepdim: Any = UNSET) -> Tensor:
        return _rd.sum(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def mean(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
             keepdim: Any = UNSET) -> Tensor:
        return _rd.mean(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def max(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
            keepdim: Any = UNSET) -> Tensor:
        return _rd.max(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def min(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
            keepdim: Any = UNSET) -> Tensor:
        return _rd.min(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def prod(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
             keepdim: Any = UNSET) -> Tensor:
        return _rd.prod(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def var(self, axis: Any = UNSET, keepdims: Any = UNSET, ddof: int = 0, *, dim: Any = UNSET,
            keepdim: Any = UNSET) -> Tensor:
        return _rd.var(self, axis, keepdims, ddof, dim=dim, keepdim=keepdim)

    def logsumexp(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
                  keepdim: Any = UNSET) -> Tensor:
        return _rd.logsumexp(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def argmax(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
               keepdim: Any = UNSET) -> Tensor:
        return _rd.argmax(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def argmin(self, axis: Any = UNSET, keepdims: Any = UNSET, *, dim: Any = UNSET,
               keepdim: Any = UNSET) -> Tensor:
        return _rd.argmin(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def reshape(self, *shape: Any) -> Tensor:
        return _sh.reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)

    def transpose(self, *axes: Any) -> Tensor:
        return _sh.transpose(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], int)
                             else (axes or None))

    def permute(self, *axes: Any) -> Tensor:
        return self.transpose(*axes)

    @property
    def T(self) -> Tensor:
        return _sh.transpose(self, None)

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        return _sh.broadcast_to(self, shape)

    def squeeze(self, axis: Any = UNSET, *, dim: Any = UNSET) -> Tensor:
        return _sh.squeeze(self, axis, dim=dim)

    def unsqueeze(self, axis: Any = UNSET, *, dim: Any = UNSET) -> Tensor:
        return _sh.unsqueeze(self, axis, dim=dim)

    def flatten(self) -> Tensor:
        return _sh.reshape(self, (self.size,))

    def flip(self, axis: Any = UNSET, *, dims: Any = UNSET) -> Tensor:
        return _sh.flip(self, axis, dims=dims)

    def exp(self) -> Tensor:
        return _ew.exp(self)

    def log(self) -> Tensor:
        return _ew.log(self)

    def sqrt(self) -> Tensor:
        return _ew.sqrt(self)

    def abs(self) -> Tensor:
        return _ew.abs(self)

    def relu(self) -> Tensor:
        return _ew.relu(self)

    def sigmoid(self) -> Tensor:
        return _ew.sigmoid(self)

    def tanh(self) -> Tensor:
        return _ew.tanh(self)

    def softmax(self, axis: Any = UNSET, *, dim: Any = UNSET) -> Tensor:
        from triplane.sdk.nn import functional as F

        return F.softmax(self, axis, dim=dim)

    def log_softmax(self, axis: Any = UNSET, *, dim: Any = UNSET) -> Tensor:
        from triplane.sdk.nn import functional as F

        return F.log_softmax(self, axis, dim=dim)


# --- making nodes -----------------------------------------------------------------------


def apply(op: str, inputs: Sequence[Tensor], **attrs: Any) -> Tensor:
    """Record ``op`` on ``inputs``: attributes normalised and the result's type inferred
    now (``sdk/inference.py``), so a bad line fails here, naming the op, the shapes and the
    user's line."""
    where = _user_line()
    a, t = infer(op, inputs, attrs, where)
    out = Tensor(op, inputs, a, t, where=where)
    for hook in record_hooks:
        hook(out)
    return out


# Called with every tensor apply() records; tp.no_grad() (sdk/autograd.py) adds its
# marker while a no_grad block is open, so the hot path pays nothing otherwise.
record_hooks: list[Callable[[Tensor], None]] = []


def is_weak(x: Any) -> bool:
    """Whether ``x`` is a Python scalar, which NEP 50 types weakly (numpy scalars such as
    ``np.float64(1)``, a float subclass, are strong: they keep their dtype)."""
    return type(x) in (bool, int, float)


def as_tensor(x: Any, like: Tensor | None = None) -> Tensor:
    """A Tensor as is; a Python scalar as a 0-d constant, weakly typed beside ``like``
    (``dtypes.result_type``) or of its own default dtype without it; anything array-like
    as host data."""
    if isinstance(x, Tensor):
        return x
    if is_weak(x):
        return scalar(x, dt.result_type(like.dtype, type(x)) if like is not None else dt.scalar_dtype(x))
    return Tensor.from_array(x)


def scalar(x: bool | int | float, d: dt.DType) -> Tensor:
    """The Python scalar ``x`` as a 0-d tensor of dtype ``d``. An int that ``d`` cannot
    hold raises OverflowError, as numpy 2 does for ``int8_array + 300``."""
    if d.kind in ("int", "uint") and not dt.fits(int(x), d):
        raise OverflowError(f"Python integer {x} out of bounds for {d.name}")
    value: bool | int | float = float(x) if d.is_float else bool(x) if d.kind == "bool" else int(x)
    if isinstance(value, float) and not _ir.fits_json(value):  # NaN, inf, -0.0: as inline bytes
        return apply("constant", [], data=_ir.encode_data(np.array(value, d.np)), shape=(), dtype=d.name)
    return apply("full", [], value=value, shape=(), dtype=d.name)


# --- graphs and evaluation ----------------------------------------------------------------


def build_graph(outputs: Sequence[Tensor], *, cut_realized: bool = True
                ) -> tuple[Graph, dict[str, Tensor], dict[str, Any]]:
    """The graph computing ``outputs``. Leaves with data (and, with ``cut_realized``,
    every already-computed tensor) become ``input`` nodes bound to their values.
    Returns the graph, node id -> Tensor, and the bindings (tensor id -> array, or the
    :class:`RemoteValue` of a value kept on a cluster: not fetched here)."""
    tensors: dict[str, Tensor] = {}
    nodes: dict[str, Node] = {}
    bindings: dict[str, Any] = {}
    seen: set[int] = set()
    for out in outputs:
        stack: list[tuple[Tensor, bool]] = [(out, False)]
        while stack:
            t, expanded = stack.pop()
            if id(t) in seen and not expanded:
                continue
            is_input = t._value is not None and (cut_realized or not t._inputs)
            if not expanded and not is_input:
                seen.add(id(t))
                stack.append((t, True))
                stack.extend((i, False) for i in reversed(t._inputs) if id(i) not in seen)
                continue
            seen.add(id(t))
            tensors[t._id] = t
            if is_input:
                assert t._value is not None
                nodes[t._id] = Node("input", (), Attrs({"tensor": t._id, "shape": t.shape,
                                                        "dtype": t.dtype.name}),
                                    t.shape, t.dtype.name)
                bindings[t._id] = t._value
            else:
                nodes[t._id] = Node(t._op, tuple(i._id for i in t._inputs), t._attrs,
                                    t.shape, t.dtype.name)
    return Graph(nodes, tuple(t._id for t in outputs)), tensors, bindings


def realize(*tensors: Tensor, keep: Sequence[Tensor] = ()) -> None:
    """Compute every given tensor in one graph run (shared work is done once).

    ``keep``: more tensors to compute in the same run whose values may stay where they
    were computed: a cluster session keeps them there (a RemoteValue, fetched when read;
    optimisers keep parameters and state so), an in-process session computes them as any."""
    todo = [t for t in tensors if t._value is None]
    seen = {id(t) for t in todo}
    kept: list[Tensor] = []
    for t in keep:
        if t._value is None and id(t) not in seen:
            seen.add(id(t))
            kept.append(t)
    if not todo and not kept:
        return
    from triplane.sdk.session import current_session

    session = current_session()
    if kept and getattr(session, "keeps_values", False):
        values = session.evaluate([*todo, *kept], keep=range(len(todo), len(todo) + len(kept)))
    else:
        values = session.evaluate([*todo, *kept])
    for t, v in zip([*todo, *kept], values):
        if type(v) is np.ndarray:
            v.flags.writeable = False
            t._value = v
        else:
            t._value = v
            t._held()


def tensors_from_graph(graph: Graph, known: Mapping[str, Tensor], ids: Iterable[str]) -> list[Tensor]:
    """Tensors for nodes ``ids`` of ``graph``, creating Tensors for nodes not in ``known``
    (how gradient nodes made by the autograd pass come back into the SDK)."""
    made = dict(known)
    for nid in graph.topo_order():
        if nid in made:
            continue
        n = graph.nodes[nid]
        made[nid] = Tensor(n.op, [made[i] for i in n.inputs], n.attrs, n.type)
    return [made[i] for i in ids]


from triplane.sdk import elementwise as _ew  # noqa: E402
from triplane.sdk import linalg as _la  # noqa: E402
from triplane.sdk import reduce as _rd  # noqa: E402
from triplane.sdk import shape as _sh  # noqa: E402
from triplane.sdk.remote_values import RemoteValue  # noqa: E402
