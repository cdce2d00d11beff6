"""User ops: the two parts of an operator, registered from Python.

:func:`register_op` puts a descriptive op in the op table (:mod:`triplane.proto.optable`:
arity, dtypes, attribute schema, shape/dtype inference, optional gradient rule) and a
kernel in the numpy engine's table, so validation, the compiler passes and the embedded
runtime treat it like a built-in. It returns the SDK function that records the op.

A kernel may come from a C shared library: :func:`load_kernel_library` wraps one exported
function of this ABI (``triplane_kernel_v1``) into a kernel::

    int fn(int32_t n_inputs,
           const void *const *inputs,          /* n_inputs C-contiguous buffers */
           const int64_t *const *input_shapes, /* input_shapes[i][0 .. input_ndims[i]) */
           const int32_t *input_ndims,
           void *out,                          /* C-contiguous, preallocated */
           const int64_t *out_shape,
           int32_t out_ndim);

Buffers hold the op's dtypes as inferred (bfloat16 arrives as float32; use ``cast_inputs``
to have every input converted to one dtype first). Attributes are not passed; bind them
in C or wrap the kernel in Python. The function returns 0 on success; any other value
becomes a :class:`~triplane.proto.errors.KernelError` (kind ``user``: bad data, not
retried) naming the op and the code. The function must not keep the pointers after
returning and must be safe to call from several threads at once.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import KernelError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import Attr, GradRule, OpDef

__all__ = ["installed_op", "load_kernel_library", "register_op", "unregister_op"]

Kernel = Callable[[Sequence[np.ndarray], Mapping[str, Any], TensorType], np.ndarray]
UserInfer = Callable[[Sequence[TensorType], Attrs], Any]

_USER_OPS: set[str] = set()
_KIND_OF_DEFAULT = {bool: "bool", int: "int", float: "float", str: "str"}


def _attr_schema(attrs: Mapping[str, Any] | None) -> dict[str, Attr]:
    """An Attr passes as is; a plain value is the default of an attribute of its kind."""
    out: dict[str, Attr] = {}
    for name, spec in (attrs or {}).items():
        if isinstance(spec, Attr):
            out[name] = spec
        elif type(spec) in _KIND_OF_DEFAULT:
            out[name] = Attr(_KIND_OF_DEFAULT[type(spec)], spec)
        elif isinstance(spec, (list, tuple)) and all(isinstance(v, int) for v in spec):
            out[name] = Attr("ints", tuple(spec))
        else:
            raise TypeError(f"attribute {name!r}: give a triplane.proto.opdef.Attr or a default value "
                            f"of type bool, int, float, str or a list of ints, not {spec!r}")
    return out


def _wrap_infer(name: str, infer: UserInfer) -> Callable[[Sequence[TensorType], Attrs], TensorType]:
    def wrapped(ins: Sequence[TensorType], a: Attrs) -> TensorType:
        t = infer(ins, a)
        if isinstance(t, TensorType):
            return t
        try:
            shape, dtype = t
            return TensorType(tuple(int(s) for s in shape), dt.dtype(dtype))
        except (TypeError, ValueError, KeyError):
            raise TypeError(f"user op {name!r}: infer must return a TensorType or (shape, dtype), "
                            f"got {t!r}") from None

    return wrapped


def register_op(name: str, *, infer: UserInfer, kernel: Kernel, arity: int | None,
                grad: GradRule | None = None, attrs: Mapping[str, Any] | None = None,
                dtypes: Sequence[str] | frozenset[str] | None = None, group: str = "user",
                nograd_inputs: Sequence[int] = (), doc: str = "") -> Callable[..., Any]:
    """Register a user op and return its SDK function ``fn(*inputs, **attrs) -> Tensor``.

    ``infer(input_types, attrs)`` returns the result's TensorType (or ``(shape, dtype)``)
    and raises :class:`~triplane.proto.errors.ShapeError` / ``DTypeError`` on bad inputs.
    ``kernel(inputs, attrs, out)`` computes it with numpy (or comes from
    :func:`load_kernel_library`). ``grad`` is a gradient rule as in the op table
    (``rule(builder, node, g) -> [grad per input or None]``); without it the op is not
    differentiable. ``attrs`` maps attribute names to ``triplane.proto.opdef.Attr`` s or to
    default values. ``dtypes`` are the accepted input dtypes (default: every float).

    Raises ValueError if ``name`` is already an op (built-in or user).
    """
    if not name.isidentifier():
        raise ValueError(f"user op name must be an identifier, got {name!r}")
    if name in optable.names():  # names() loads the built-ins first
        kind = "user op" if name in _USER_OPS else f"built-in op of group {optable.get(name).group!r}"
        raise ValueError(f"op {name!r} is already registered ({kind}); pick another name "
                         f"or unregister_op({name!r}) first")
    from triplane.engines.op.numpy_kernels import KERNELS

    if name in KERNELS:
        raise ValueError(f"the numpy engine already has a kernel named {name!r}")
    accepted = frozenset(dtypes) if dtypes is not None else dt.FLOATS
    unknown = accepted - dt.EVERY
    if unknown:
        raise ValueError(f"unknown dtype(s) {sorted(unknown)} (known: {sorted(dt.EVERY)})")
    opdef = OpDef(name, group, arity, _wrap_infer(name, infer), attrs=_attr_schema(attrs),
                  dtypes=accepted, grad=grad, nograd_inputs=frozenset(nograd_inputs),
                  doc=doc or f"user op {name}")
    optable.register(opdef)
    KERNELS[name] = kernel
    _USER_OPS.add(name)

    def fn(*inputs: Any, **attrs: Any) -> Any:
        from triplane.sdk.tensor import apply, as_tensor

        return apply(name, [as_tensor(x) for x in inputs], **attrs)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = opdef.doc
    return fn


def installed_op(name: str) -> Callable[..., Any]:
    """The SDK function ``fn(*inputs, **attrs) -> Tensor`` of an op that an installed
    package brings (entry point ``triplane.ops``; docs/plugins.md), its definitions loaded
    into this process's op table first. Its kernel runs on the executors that have the
    package's engine. UnknownOpError naming the op if no installed package (and no
    built-in) defines it."""
    from triplane.engines.registry import load_op_plugins

    load_op_plugins()
    opdef = optable.get(name)  # raises UnknownOpError, listing close names

    def fn(*inputs: Any, **attrs: Any) -> Any:
        from triplane.sdk.tensor import apply, as_tensor

        return apply(name, [as_tensor(x) for x in inputs], **attrs)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = opdef.doc
    return fn


def unregister_op(name: str) -> None:
    """Remove a user op (built-ins cannot be removed)."""
    if name not in _USER_OPS:
        raise ValueError(f"{name!r} is not a registered user op")
    from triplane.engines.op.numpy_kernels import KERNELS

    optable.unregister(name)
    KERNELS.pop(name, None)
    _USER_OPS.discard(name)


_KERNEL_ARGTYPES = [
    ctypes.c_int32,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
    ctypes.POINTER(ctypes.c_int32),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_int64),
    ctypes.c_int32,
]


def load_kernel_library(path: str | os.PathLike[str], symbol: str, *,
                        cast_inputs: str | dt.DType | None = None) -> Kernel:
    """A kernel calling ``symbol`` of the shared library at ``path`` (ABI in the module
    docstring). Raises OSError if the library cannot be loaded and AttributeError naming
    the symbol if it is not exported."""
    lib = ctypes.CDLL(os.fspath(path))
    try:
        cfn = getattr(lib, symbol)
    except AttributeError:
        raise AttributeError(f"{os.fspath(path)} exports no symbol {symbol!r}") from None
    cfn.argtypes = _KERNEL_ARGTYPES
    cfn.restype = ctypes.c_int
    want = dt.dtype(cast_inputs).np if cast_inputs is not None else None

    def kernel(ins: Sequence[np.ndarray], a: Mapping[str, Any], out: TensorType) -> np.ndarray:
        arrays = [np.ascontiguousarray(x if want is None else x.astype(want, copy=False)) for x in ins]
        result = np.zeros(out.shape, dtype=out.dtype.np)
        shapes = [np.asarray(x.shape, dtype=np.int64) for x in arrays]
        n = len(arrays)
        data = (ctypes.c_void_p * max(n, 1))(*(x.ctypes.data for x in arrays))
        shape_ptrs = (ctypes.POINTER(ctypes.c_int64) * max(n, 1))(
            *(s.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) for s in shapes))
        ndims = (ctypes.c_int32 * max(n, 1))(*(x.ndim for x in arrays))
        out_shape = np.asarray(out.shape, dtype=np.int64)
        rc = cfn(n, data, shape_ptrs, ndims, ctypes.c_void_p(result.ctypes.data),
                 out_shape.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(out.shape))
        if rc != 0:
            raise KernelError(f"C kernel {symbol!r} returned error code {rc}", kind="user")
        return result

    kernel.__name__ = symbol
    kernel._library = lib  # type: ignore[attr-defined]  # keeps the library loaded
    return kernel
