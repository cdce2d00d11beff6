"""The numpy op engine: the reference implementation every other engine is checked against.

Kernels live in :mod:`triplane.engines.op.numpy_kernels`, one module per op group, in
one table (``numpy_kernels.KERNELS``; ``numpy_kernels/table.py`` says what a kernel is).

bfloat16 has no native numpy arithmetic: inputs in it are computed in float32 and the
result is rounded back, which is what hardware with bfloat16 storage does too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from triplane.engines.op.numpy_kernels import KERNELS, PREPARERS
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import KernelError, TriplaneError
from triplane.proto.ir import TensorType

_BF16 = dt.bfloat16.np
_USER_ERRORS = (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError)


class NumpyEngine:
    """Runs every op of the table on host memory with numpy."""

    name = "numpy"
    device = "cpu"

    def supports(self, op: str, dtypes: Sequence[str] = ()) -> bool:
        if op not in KERNELS:
            return False
        try:
            accepted = optable.get(op).dtypes
        except Exception:
            return False
        return all(d in accepted for d in dtypes)

    def cheap(self, op: str, inputs: Sequence[np.ndarray]) -> bool:
        """Whether the kernel of ``op`` on ``inputs`` returns a view of its input: O(1)
        however big the tile (the executor runs it inline, not behind a running kernel)."""
        try:
            view = optable.get(op).view
        except TriplaneError:
            return False
        # bfloat16 is computed in float32 and rounded back: a copy. Asked second, as it was
        # before ``view`` moved onto the op: ``dtype.name`` costs ~1 us a tile per task.
        return view and not any(a.dtype.name == "bfloat16" for a in inputs)

    def run(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
            out: TensorType) -> np.ndarray:
        fn = KERNELS.get(op)
        if fn is None:
            raise KernelError(f"the numpy engine has no kernel for {op!r}", op=op, kind="infra")
        if any(a.dtype == _BF16 for a in inputs):
            inputs = [a.astype(np.float32) if a.dtype == _BF16 else a for a in inputs]
        try:
            with np.errstate(all="ignore"):
                result = fn(inputs, attrs, out)
        except KernelError:
            raise
        except _USER_ERRORS as e:
            raise KernelError(f"{type(e).__name__}: {e}", op=op) from e
        result = np.asarray(result)
        if result.shape != out.shape:
            raise KernelError(f"kernel gave shape {result.shape}, expected {out.shape}", op=op,
                              kind="infra")
        if result.dtype != out.dtype.np:
            with np.errstate(all="ignore"):  # rounding to float16 may overflow to inf: IEEE's answer
                result = result.astype(out.dtype.np)
        return result

    def bind(self, op: str, attrs: Mapping[str, Any], out: TensorType,
             in_types: Sequence[TensorType]) -> Callable[[list[np.ndarray]], np.ndarray] | None:
        """:meth:`run` of one node prepared once, for a kernel list replayed step after step:
        ``bind(...)(inputs)`` is ``run(op, inputs, attrs, out)`` for inputs of ``in_types``
        (the same checks, conversions and errors) without looking anything up again, and
        with what the op's preparer (``numpy_kernels.PREPARERS``: a small fused program's
        plan) does once. None when there is no kernel for ``op`` (``run`` raises that when
        the node runs). numpy's floating-point error state is the caller's: call it under
        ``np.errstate(all="ignore")``, as ``run`` sets it."""
        fn = KERNELS.get(op)
        if fn is None:
            return None
        widen = any(t.dtype.np == _BF16 for t in in_types)
        shape, dtype = out.shape, out.dtype.np
        ready = None
        prepare = PREPARERS.get(op)
        if prepare is not None and not widen:
            try:
                ready = prepare(attrs, in_types, out)
            except Exception:  # a malformed node: its kernel raises when it runs
                ready = None

        def call(inputs: list[np.ndarray]) -> np.ndarray:
            if widen:
                inputs = [a.astype(np.float32) if a.dtype == _BF16 else a for a in inputs]
            try:
                result = fn(inputs, attrs, out) if ready is None else ready(inputs)
            except KernelError:
                raise
            except _USER_ERRORS as e:
                raise KernelError(f"{type(e).__name__}: {e}", op=op) from e
            if type(result) is not np.ndarray:
                result = np.asarray(result)
            if result.shape != shape:
                raise KernelError(f"kernel gave shape {result.shape}, expected {shape}", op=op,
                                  kind="infra")
            if result.dtype != dtype:
                result = result.astype(dtype)
            return result

        return call

    def benchmark(self, size: int = 512, budget_s: float = 0.25) -> dict[str, float]:
        """Measured figures for the registry: matmul GFLOP/s and elementwise GB/s.

        Each figure is the best of repeated runs: at least 3, then until its share of
        ``budget_s`` is spent (a quarter for the matmuls, the rest for the slower passes).
        A single run on a busy machine (several executors starting at once) can be off by
        100x, and the tiler and placement size tasks by these numbers. The matmuls run back
        to back, apart from the elementwise passes: run after a pass over 192 MiB, a
        256 x 256 matmul started with cold caches every time and measured 92-104 GFLOP/s on
        one core here, where tile-sized matmuls ran at 150-157."""
        rng = np.random.default_rng(0)
        a = rng.standard_normal((size, size), dtype=np.float32)
        mm = _best(lambda: a @ a, 2 * size**3, budget_s / 4)
        # Well beyond the caches (3 x 64 MiB), as tiles are. At 3 x 16 MiB part of the
        # traffic stayed in this machine's L3, so the figure swung between 9.6 and 21 GB/s
        # with what else ran, against the 8-12.5 GB/s tile-sized kernels here run at.
        x = np.full(1 << 24, 1.5, dtype=np.float32)  # the values do not matter to an add
        y, z = x.copy(), np.zeros_like(x)
        ew = _best(lambda: np.add(x, y, out=z), 3 * x.nbytes, budget_s * 3 / 4)
        return {"matmul_gflops": mm / 1e9, "elementwise_gbps": ew / 1e9}


def _best(run: Callable[[], object], work: float, budget_s: float, cap: int = 200) -> float:
    """The best rate (``work`` per second) of ``run`` over at least 3 calls, then more
    until ``budget_s`` is spent (at most ``cap``)."""
    best = 0.0
    deadline = time.perf_counter() + budget_s
    for i in range(cap):
        if i >= 3 and time.perf_counter() >= deadline:
            break
        t = time.perf_counter()
        run()
        best = max(best, work / max(time.perf_counter() - t, 1e-9))
    return best
