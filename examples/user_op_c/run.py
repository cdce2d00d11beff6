"""Build hypot.c, register it as the user op ``hypot`` and run it through triplane.

    python examples/user_op_c/run.py

Needs a C compiler (``cc``). The op's descriptive half (inference, gradient) is Python;
its kernel is the C function ``tp_hypot``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import triplane as tp
from triplane.proto.builder import Builder, Ref
from triplane.proto.errors import ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import GradCtx
from triplane.sdk.custom import load_kernel_library, register_op

HERE = Path(__file__).resolve().parent


def build(out_dir: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("no C compiler found (cc/gcc)")
    lib = out_dir / "libhypot.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(HERE / "hypot.c"), "-lm"], check=True)
    return lib


def infer(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    x, y = ins
    if x != y:
        raise ShapeError(f"hypot needs two tensors of one shape and dtype, got {x} and {y}")
    return x


def grad(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    x, y = n.inputs
    return [g * x / n.out, g * y / n.out]  # d/dx sqrt(x^2 + y^2) = x / hypot


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        kernel = load_kernel_library(build(Path(tmp)), "tp_hypot")
        hypot = register_op("hypot", infer=infer, kernel=kernel, grad=grad, arity=2, dtypes=["float32"])
        x = tp.Tensor.from_array(np.array([3.0, 5.0, 8.0], dtype=np.float32), requires_grad=True)
        y = tp.Tensor.from_array(np.array([4.0, 12.0, 15.0], dtype=np.float32))
        z = hypot(x, y)
        print("hypot:", z.numpy())                  # [ 5. 13. 17.]
        print("d sum / dx:", tp.grad(z.sum(), x)[0].numpy())  # x / hypot


if __name__ == "__main__":
    main()
