"""Test helpers for op and gradient authors (triplane's own tests use them too).

``run_op`` runs one op of the table through the whole path a user's graph takes
(SDK recording, validation, passes, the embedded runtime). ``check_grad`` compares the
autograd pass with float64 central finite differences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["TOLERANCE", "assert_close", "check_grad", "numeric_grad", "random_array", "run_op"]


def run_op(op: str, inputs: Sequence[np.ndarray], **attrs: Any) -> np.ndarray:
    """The value of ``op(*inputs, **attrs)`` computed by triplane."""
    from triplane.sdk.tensor import Tensor, apply

    ts = [Tensor.from_array(np.asarray(x)) for x in inputs]
    return apply(op, ts, **attrs).numpy()


def numeric_grad(f: Callable[[list[np.ndarray]], float], xs: list[np.ndarray], i: int,
                 eps: float) -> np.ndarray:
    """d f / d xs[i] by central differences."""
    x = xs[i]
    g = np.zeros_like(x, dtype=np.float64)
    flat = x.reshape(-1)
    for k in range(flat.size):
        old = flat[k]
        flat[k] = old + eps
        hi = f(xs)
        flat[k] = old - eps
        lo = f(xs)
        flat[k] = old
        g.reshape(-1)[k] = (hi - lo) / (2 * eps)
    return g


def check_grad(fn: Callable[..., Any], inputs: Sequence[np.ndarray], *, wrt: Sequence[int] | None = None,
               eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-6,
               seed: int = 0) -> None:
    """Assert that triplane's gradient of ``fn`` matches finite differences.

    ``fn`` takes Tensors (one per input) and returns a Tensor. Float inputs are made
    float64; a non-scalar result is reduced with fixed random weights so every output
    element's gradient is exercised. ``wrt`` selects the inputs checked (default: every
    floating-point input). Raises AssertionError naming the input and the worst element.
    """
    from triplane.sdk.autograd import grad
    from triplane.sdk.tensor import Tensor

    xs = [np.array(x, dtype=np.float64) if np.asarray(x).dtype.kind == "f" else np.array(x)
          for x in inputs]
    if wrt is None:
        wrt = [i for i, x in enumerate(xs) if x.dtype.kind == "f"]
    rng = np.random.default_rng(seed)
    weights: list[np.ndarray] = []

    def forward(arrays: list[np.ndarray]) -> tuple[Any, list[Tensor]]:
        ts = [Tensor.from_array(a.copy()) for a in arrays]
        y = fn(*ts)
        if not weights:
            weights.append(rng.standard_normal(y.shape))
        loss = (y * Tensor.from_array(weights[0].astype(y.dtype.np))).sum() if y.shape else y
        return loss, ts

    loss, ts = forward(xs)
    analytic = grad(loss, [ts[i] for i in wrt])

    def value(arrays: list[np.ndarray]) -> float:
        return float(forward(arrays)[0].numpy())

    for i, g in zip(wrt, analytic):
        numeric = numeric_grad(value, xs, i, eps)
        got = g.numpy()
        if got.shape != numeric.shape or not np.allclose(got, numeric, rtol=rtol, atol=atol):
            err = np.abs(got - numeric) if got.shape == numeric.shape else None
            worst = np.unravel_index(int(np.argmax(err)), err.shape) if err is not None and err.size else None
            detail = (f"worst at {worst}: autograd {got[worst]!r} vs numeric {numeric[worst]!r}"
                      if worst is not None else f"shapes {got.shape} vs {numeric.shape}")
            raise AssertionError(f"gradient of input {i} is wrong ({detail})\nautograd:\n{got}\n"
                                 f"numeric:\n{numeric}")


# (rtol, atol) by dtype for comparing an op's result with a float64 numpy reference.
TOLERANCE: dict[str, tuple[float, float]] = {
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "float32": (2e-6, 1e-6),
    "float64": (1e-12, 1e-12),
}


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str | None = None, *,
                 rtol: float | None = None, atol: float | None = None, what: str = "") -> None:
    """Assert same shape and values within the dtype's tolerance (exact for ints/bools).
    ``want`` should be computed in float64 from the same (already rounded) inputs."""
    got, want = np.asarray(got), np.asarray(want)
    dtype = dtype or got.dtype.name
    assert got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}"
    if dtype in TOLERANCE:
        r, a = TOLERANCE[dtype]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=rtol if rtol is not None else r,
                                   atol=atol if atol is not None else a, err_msg=what, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: str = "float32",
                 low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Fresh random data of ``dtype``: uniform floats in [low, high), ints in
    [low, high], bools at random."""
    from triplane.proto import dtypes as dt

    d = dt.dtype(dtype)
    if d.kind == "bool":
        return rng.random(tuple(shape)) < 0.5
    if d.kind in ("int", "uint"):
        lo = max(int(low), 0) if d.kind == "uint" else int(low)
        return rng.integers(lo, int(high) + 1, size=tuple(shape)).astype(d.np)
    return rng.uniform(low, high, size=tuple(shape)).astype(d.np)
