"""triplane: run deep-learning compute graphs on a cluster (or in this process).

``import triplane as tp``: tensors and their functions are here (numpy-like names);
``tp.nn`` (modules and ``tp.nn.functional``), ``tp.optim`` and ``tp.data`` hold the
training kit. See docs/quickstart.md. The names below are the public surface; a test
pins them.
"""

import sys as _sys

from triplane import embedded as _embedded
from triplane._version import __version__
from triplane.proto.dtypes import (
    DType,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
)
from triplane.proto.errors import (
    DTypeError,
    GraphError,
    KernelError,
    ModelFileError,
    NotDifferentiableError,
    ShapeError,
    TriplaneError,
)
from triplane.sdk import data, nn, optim
from triplane.sdk.autograd import (
    backward,
    grad,
    is_grad_enabled,
    no_grad,
)
from triplane.sdk.compile import compile
from triplane.sdk.creation import (
    arange,
    eye,
    full,
    full_like,
    manual_seed,
    normal,
    ones,
    ones_like,
    rand,
    randn,
    tensor,
    uniform,
    zeros,
    zeros_like,
)
from triplane.sdk.custom import (
    register_op,
)
from triplane.sdk.elementwise import (
    abs,
    add,
    cast,
    ceil,
    cos,
    div,
    eq,
    erf,
    exp,
    floor,
    floor_divide,
    ge,
    gelu,
    gt,
    le,
    log,
    logical_and,
    logical_not,
    logical_or,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow,
    reciprocal,
    relu,
    remainder,
    rsqrt,
    sigmoid,
    sign,
    silu,
    sin,
    sqrt,
    square,
    sub,
    tan,
    tanh,
    where,
)
from triplane.sdk.lifecycle import (
    set_progress,
)
from triplane.sdk.linalg import (
    matmul,
)
from triplane.sdk.model import (
    Model,
    TensorSpec,
    load_model,
    save_model,
)
from triplane.sdk.reduce import (
    argmax,
    argmin,
    logsumexp,
    max,
    mean,
    min,
    prod,
    sum,
    var,
)
from triplane.sdk.remote import (
    connect,
    disconnect,
)
from triplane.sdk.serialize import (
    load,
    save,
)
from triplane.sdk.shape import (
    TensorIndexError,
    broadcast_to,
    concat,
    concatenate,
    expand_dims,
    flip,
    gather,
    getitem,
    index_select,
    pad,
    permute,
    reshape,
    slice,
    split,
    squeeze,
    stack,
    transpose,
    unsqueeze,
)
from triplane.sdk.tensor import (
    Tensor,
    realize,
)

# The SDK runs graphs in this process by default: the embedded session, which the SDK
# cannot import itself (it sits beside the compiler and the executor). Installed here.
_embedded.install()


# ``import triplane.nn`` / ``from triplane.nn import functional as F`` name the SDK's
# modules, as ``torch.nn`` does: one module object under two names, no copy.
for _name, _mod in (("nn", nn), ("nn.functional", nn.functional), ("optim", optim),
                    ("optim.lr_scheduler", optim.lr_scheduler), ("data", data),
                    ("data.transforms", data.transforms), ("data.datasets", data.datasets)):
    _sys.modules[f"{__name__}.{_name}"] = _mod
del _sys, _name, _mod


def serve(model, **options):  # type: ignore[no-untyped-def]
    """Serve a model file over HTTP/gRPC with dynamic batching (docs/serving.md); the
    arguments are :func:`triplane.cli_serve.serve`'s. Imported on first use: the server's
    packages (FastAPI, gRPC) stay out of ``import triplane``."""
    from triplane.cli_serve import serve as _serve

    return _serve(model, **options)


__all__ = [
    "Model", "ModelFileError", "TensorSpec", "load_model", "save_model",  # model files (sdk/model.py)
    "serve",  # the model server (triplane/serving, docs/serving.md)
    "DType", "DTypeError", "GraphError", "KernelError", "NotDifferentiableError", "ShapeError",
    "Tensor", "TensorIndexError", "TriplaneError", "__version__", "abs", "add", "arange", "argmax",
    "argmin", "backward", "bfloat16", "bool_", "broadcast_to", "cast", "ceil", "compile", "concat",
    "concatenate", "connect", "cos", "data", "disconnect", "div", "eq", "erf", "exp", "expand_dims",
    "eye", "flip", "float16", "float32", "float64", "floor", "floor_divide", "full", "full_like",
    "gather", "ge", "gelu", "getitem", "grad", "gt", "index_select", "int16", "int32", "int64", "int8",
    "is_grad_enabled", "le", "load", "log", "logical_and", "logical_not", "logical_or", "logsumexp",
    "lt", "manual_seed", "matmul", "max", "maximum", "mean", "min", "minimum", "mul", "ne", "neg", "nn",
    "no_grad", "normal", "ones", "ones_like", "optim", "pad", "permute", "pow", "prod", "rand", "randn",
    "realize", "reciprocal", "register_op", "relu", "remainder", "reshape", "rsqrt", "save",
    "set_progress", "sigmoid", "sign", "silu", "sin", "slice", "split", "sqrt", "square", "squeeze",
    "stack", "sub", "sum", "tan", "tanh", "tensor", "transpose", "uint8", "uniform", "unsqueeze", "var",
    "where", "zeros", "zeros_like"
]
