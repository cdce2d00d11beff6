"""The workloads of bench/compute.py: inputs, the computation, and how a result is checked.

Every system computes the same numbers: inputs come from one seeded numpy generator
(:func:`make_inputs`), numpy and Dask run :func:`compute` (the same operators on either
array type), triplane runs :func:`triplane_outputs` (the SDK, with its autograd for the
MLP), Ray runs hand-written blocks of the same. A result is checked by *probes*: sampled
blocks and scalars (:data:`PROBES`) compared with a float64 :func:`reference` within a
relative tolerance (:func:`check` returns what is wrong, or None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SEED = 20240604
LR = 0.1  # SGD step; large enough that a wrong gradient moves the checked weights visibly
PROBE = 32  # side of the sampled result blocks that are checked


@dataclass(frozen=True)
class Workload:
    """One measured computation. ``n`` is the matrix side (matmul, chain) or the batch
    (mlp, with ``width``)."""

    kind: str  # matmul | chain | mlp
    n: int
    width: int = 0

    @property
    def key(self) -> str:
        return f"{self.kind} {self.n}x{self.width}" if self.kind == "mlp" else f"{self.kind} {self.n}^2"

    @property
    def unit(self) -> str:
        return "GB/s" if self.kind == "chain" else "GFLOP/s"

    @property
    def work(self) -> float:
        """Flops (matmul, mlp) or bytes read (chain) of one run."""
        if self.kind == "matmul":
            return 2.0 * self.n**3
        if self.kind == "chain":
            return 4.0 * self.n**2
        return 8 * 2.0 * self.n * self.width**2

    @property
    def n_outputs(self) -> int:
        return 4 if self.kind == "mlp" else 1

    def default_chunks(self) -> tuple[int, int]:
        if self.kind == "mlp":
            return (min(1024, self.n), min(1024, self.width))
        return (max(1, self.n // 4), max(1, self.n // 4))


def make_inputs(w: Workload) -> dict[str, np.ndarray]:
    """The workload's inputs (seeded: the same in every process)."""
    rng = np.random.default_rng(SEED + w.n + w.width)
    f32 = np.float32
    if w.kind == "matmul":
        return {"a": rng.standard_normal((w.n, w.n), f32), "b": rng.standard_normal((w.n, w.n), f32)}
    if w.kind == "chain":
        return {"x": rng.standard_normal((w.n, w.n), f32) * f32(0.5)}
    scale = f32(1 / np.sqrt(w.width))
    out = {"x": rng.standard_normal((w.n, w.width), f32), "y": rng.standard_normal((w.n, w.width), f32)}
    for k in ("w1", "w2", "w3"):
        out[k] = rng.standard_normal((w.width, w.width), f32) * scale
    return out


def compute(w: Workload, v: dict[str, Any], xp: Any) -> list[Any]:
    """The workload on numpy arrays (``xp`` = numpy) or Dask arrays (``xp`` = dask.array),
    written as a user of either would; the outputs in the order ``PROBES`` index them."""
    if w.kind == "matmul":
        return [v["a"] @ v["b"]]
    if w.kind == "chain":
        return [xp.exp(v["x"] * 2 + 1).sum()]
    x, y, w1, w2, w3 = v["x"], v["y"], v["w1"], v["w2"], v["w3"]
    h1 = xp.maximum(x @ w1, 0)
    h2 = xp.maximum(h1 @ w2, 0)
    out = h2 @ w3
    diff = out - y
    loss = (diff * diff).sum() / w.n
    d_out = diff * (2.0 / w.n)
    g3 = h2.T @ d_out
    d_h2 = (d_out @ w3.T) * (h2 > 0)
    g2 = h1.T @ d_h2
    d_h1 = (d_h2 @ w2.T) * (h1 > 0)
    g1 = x.T @ d_h1
    return [w1 - LR * g1, w2 - LR * g2, w3 - LR * g3, loss]


_LAST, _FIRST = slice(-PROBE, None), slice(0, PROBE)
# name -> (output index, index into that output): the sampled values every system reports.
PROBES: dict[str, dict[str, tuple[int, tuple[slice, ...]]]] = {
    "matmul": {"c_first": (0, (_FIRST, _FIRST)), "c_last": (0, (_LAST, _LAST))},
    "chain": {"sum": (0, ())},
    "mlp": {"w1_last": (0, (_LAST, _LAST)), "w2_first": (1, (_FIRST, _FIRST)),
            "w3_first": (2, (_FIRST, _FIRST)), "loss": (3, ())},
}
TOLERANCE = {"matmul": 1e-4, "chain": 1e-4, "mlp": 2e-3}  # max |err| / max |reference|


def _index(x: Any, idx: tuple[slice, ...]) -> Any:
    return x[idx]


def probes(w: Workload, outs: Sequence[Any],
           read: Callable[[Any, tuple[slice, ...]], Any] = _index) -> dict[str, np.ndarray]:
    """The sampled values of a run's outputs, each read with ``read(output, index)``."""
    return {name: np.asarray(read(outs[i], idx), dtype=np.float64)
            for name, (i, idx) in PROBES[w.kind].items()}


def reference(w: Workload, v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The probes computed in float64 (only the sampled blocks for matmul)."""
    if w.kind == "matmul":
        a, b = v["a"].astype(np.float64), v["b"].astype(np.float64)
        return {"c_first": a[_FIRST] @ b[:, _FIRST], "c_last": a[_LAST] @ b[:, _LAST]}
    v64 = {k: a.astype(np.float64) for k, a in v.items()}
    return probes(w, compute(w, v64, np))


def check(w: Workload, got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> str | None:
    """None when every probe is within the workload's tolerance, else what is wrong."""
    tol = TOLERANCE[w.kind]
    for name, r in ref.items():
        g = got.get(name)
        if g is None or np.shape(g) != np.shape(r):
            return f"{name}: missing or of shape {np.shape(g)}, expected {np.shape(r)}"
        if not np.all(np.isfinite(g)):
            return f"{name}: not finite"
        err = float(np.max(np.abs(g - r))) / max(float(np.max(np.abs(r))), 1e-30)
        if err > tol:
            return f"{name}: relative error {err:.2e} > {tol:.0e}"
    return None


def triplane_outputs(w: Workload, t: dict[str, Any]) -> list[Any]:
    """The workload in the SDK; the MLP's gradients come from triplane's autograd."""
    import triplane as tp

    if w.kind == "matmul":
        return [t["a"] @ t["b"]]
    if w.kind == "chain":
        return [tp.exp(t["x"] * 2 + 1).sum()]
    h1 = tp.relu(t["x"] @ t["w1"])
    h2 = tp.relu(h1 @ t["w2"])
    diff = h2 @ t["w3"] - t["y"]
    loss = (diff * diff).sum() / w.n
    g1, g2, g3 = tp.grad(loss, [t["w1"], t["w2"], t["w3"]])
    return [t["w1"] - LR * g1, t["w2"] - LR * g2, t["w3"] - LR * g3, loss]
