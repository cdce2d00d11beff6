"""The cupy op engine: the numpy kernels, run on a CUDA GPU.

cupy implements numpy's array API and its dispatch protocols (``__array_ufunc__``,
``__array_function__``), so most numpy kernels run on device arrays unchanged; results a
kernel makes on the host (creation ops) are moved to the device. Inputs may be numpy or
cupy arrays; outputs are cupy arrays (the memory engine of a GPU node keeps them there).
Ops whose kernels need host-only code (ctypes user kernels, ``np.add.at``) are not
claimed by :meth:`supports` and run on the numpy engine instead. A ``fused`` program runs
over whole device arrays, one step at a time, then its reduction epilogue if it has one
(the numpy kernel's slicing saves host cache, not device memory bandwidth).

Needs ``pip install triplane[gpu]`` and a GPU; constructing the engine without one raises
:class:`GPUUnavailable` saying why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from triplane.engines.op.numpy_engine import NumpyEngine
from triplane.engines.op.numpy_kernels import KERNELS
from triplane.engines.op.numpy_kernels.fused import run_whole
from triplane.proto.errors import KernelError, TriplaneError
from triplane.proto.ir import TensorType

# Kernels that use host-only numpy features (np.add.at, frompyfunc, Python loops).
HOST_ONLY = frozenset({"scatter_add", "embedding_grad", "unslice"})


class GPUUnavailable(TriplaneError, RuntimeError):
    pass


def _cupy() -> Any:
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError as e:
        raise GPUUnavailable(f"cupy is not installed ({e}); pip install 'triplane[gpu]'") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise GPUUnavailable("cupy found no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise GPUUnavailable(f"no usable CUDA device: {e}") from None
    return cupy


def gpu_available() -> tuple[bool, str]:
    """(True, "") where the engine can run, else (False, the reason)."""
    try:
        _cupy()
    except GPUUnavailable as e:
        return False, str(e)
    return True, ""


class CupyEngine:
    name = "cupy"

    def __init__(self, device: int = 0) -> None:
        self.cp = _cupy()
        self.device_id = device
        self.device = f"cuda:{device}"
        self._host = NumpyEngine()  # loads the kernels

    def supports(self, op: str, dtypes: Sequence[str] = ()) -> bool:
        return op not in HOST_ONLY and self._host.supports(op, dtypes) and "bfloat16" not in dtypes

    def run(self, op: str, inputs: Sequence[Any], attrs: Mapping[str, Any], out: TensorType) -> Any:
        cp = self.cp
        fn = KERNELS.get(op)
        if fn is None or op in HOST_ONLY:
            raise KernelError(f"the cupy engine has no kernel for {op!r}", op=op, kind="infra")
        with cp.cuda.Device(self.device_id):
            xs = [cp.asarray(x) for x in inputs]
            try:
                if op == "fused":
                    result = run_whole(xs, attrs, out, asarray=cp.asarray)
                else:
                    result = fn(xs, attrs, out)
            except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError) as e:
                raise KernelError(f"{type(e).__name__}: {e}", op=op) from e
            result = cp.asarray(result)
            if tuple(result.shape) != out.shape:
                raise KernelError(f"kernel gave shape {tuple(result.shape)}, expected {out.shape}",
                                  op=op, kind="infra")
            return result.astype(out.dtype.np, copy=False)

    def benchmark(self, size: int = 2048) -> dict[str, float]:
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            a = cp.random.standard_normal((size, size), dtype=np.float32)
            a @ a
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            a @ a
            stop.record()
            stop.synchronize()
            mm = 2 * size**3 / max(cp.cuda.get_elapsed_time(start, stop) / 1e3, 1e-9) / 1e9
            x = cp.random.standard_normal(1 << 24, dtype=np.float32)
            start.record()
            cp.add(x, x, out=x)
            stop.record()
            stop.synchronize()
            ew = 3 * x.nbytes / max(cp.cuda.get_elapsed_time(start, stop) / 1e3, 1e-9) / 1e9
        return {"matmul_gflops": mm, "elementwise_gbps": ew}
