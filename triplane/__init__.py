"""triplane: run deep-learning compute graphs on a cluster (or in this process).

``import triplane as tp``; see docs/quickstart.md.
"""

from triplane.proto.dtypes import (
    DType, bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64, uint8,
)
from triplane.sdk.autograd import backward, grad
from triplane.sdk.elementwise import *  # noqa: F403
from triplane.sdk.elementwise import __all__ as _ew_all
from triplane.sdk.linalg import *  # noqa: F403
from triplane.sdk.linalg import __all__ as _la_all
from triplane.sdk.reduce import *  # noqa: F403
from triplane.sdk.reduce import __all__ as _rd_all
from triplane.sdk.shape import *  # noqa: F403
from triplane.sdk.shape import __all__ as _sh_all
from triplane.sdk.tensor import Tensor, realize

__version__ = "0.1.0"

__all__ = sorted({
    "DType", "Tensor", "__version__", "backward", "bfloat16", "bool_", "float16", "float32",
    "float64", "grad", "int8", "int16", "int32", "int64", "realize", "uint8",
    *_ew_all, *_la_all, *_rd_all, *_sh_all,
})
