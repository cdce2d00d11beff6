"""The public surface of ``import triplane as tp`` is deliberate: this test pins it, so a
name appears or disappears only on purpose (update the list here in the same change)."""

from __future__ import annotations

import triplane as tp

PUBLIC = [
    "DType",
    "DTypeError",
    "GraphError",
    "KernelError",
    "Model",
    "ModelFileError",
    "NotDifferentiableError",
    "ShapeError",
    "Tensor",
    "TensorSpec",
    "TensorIndexError",
    "TriplaneError",
    "__version__",
    "abs",
    "add",
    "arange",
    "argmax",
    "argmin",
    "backward",
    "bfloat16",
    "bool_",
    "broadcast_to",
    "cast",
    "ceil",
    "compile",
    "concat",
    "concatenate",
    "connect",
    "cos",
    "data",
    "disconnect",
    "div",
    "eq",
    "erf",
    "exp",
    "expand_dims",
    "eye",
    "flip",
    "float16",
    "float32",
    "float64",
    "floor",
    "floor_divide",
    "full",
    "full_like",
    "gather",
    "ge",
    "gelu",
    "getitem",
    "grad",
    "gt",
    "index_select",
    "int16",
    "int32",
    "int64",
    "int8",
    "is_grad_enabled",
    "le",
    "load",
    "load_model",
    "log",
    "logical_and",
    "logical_not",
    "logical_or",
    "logsumexp",
    "lt",
    "manual_seed",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mul",
    "ne",
    "neg",
    "nn",
    "no_grad",
    "normal",
    "ones",
    "ones_like",
    "optim",
    "pad",
    "permute",
    "pow",
    "prod",
    "rand",
    "randn",
    "realize",
    "reciprocal",
    "register_op",
    "relu",
    "remainder",
    "reshape",
    "rsqrt",
    "save",
    "save_model",
    "serve",
    "set_progress",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "slice",
    "split",
    "sqrt",
    "square",
    "squeeze",
    "stack",
    "sub",
    "sum",
    "tan",
    "tanh",
    "tensor",
    "transpose",
    "uint8",
    "uniform",
    "unsqueeze",
    "var",
    "where",
    "zeros",
    "zeros_like",
]


def test_public_names_are_pinned() -> None:
    assert sorted(tp.__all__) == sorted(PUBLIC)


def test_every_public_name_exists() -> None:
    missing = [n for n in tp.__all__ if not hasattr(tp, n)]
    assert not missing


def test_star_import_gives_exactly_the_public_names() -> None:
    ns: dict[str, object] = {}
    exec("from triplane import *", ns)
    assert sorted(k for k in ns if k != "__builtins__") == sorted(PUBLIC)


def test_submodule_surfaces() -> None:
    assert {"Linear", "Conv2d", "Sequential", "Module", "BatchNorm2d", "functional"} <= set(tp.nn.__all__)
    assert {"softmax", "cross_entropy", "conv2d", "dropout"} <= set(tp.nn.functional.__all__)
    assert {"SGD", "Adam"} <= set(tp.optim.__all__)
    assert {"AdamW", "RMSprop", "StepLR", "CosineAnnealingLR", "LinearLR"} <= set(tp.optim.__all__)
    assert {"CrossEntropyLoss", "MSELoss"} <= set(tp.nn.__all__)
    assert {"DataLoader", "Dataset", "TensorDataset", "datasets", "transforms"} <= set(tp.data.__all__)
    assert tp.optim.lr_scheduler.StepLR is tp.optim.StepLR
