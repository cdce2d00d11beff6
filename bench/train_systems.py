"""The systems bench/train.py times: one optimiser step of an MLP trained with Adam on
softmax cross entropy, written the way each system's users write it.

Every system starts from the same weights (drawn once from a seeded numpy generator, torch's
``nn.Linear`` init) and sees the same minibatches in the same order, so the losses after the
timed steps agree and are printed beside the times as a check. A system is a class with
``step(x, y) -> None`` (one optimiser step, finished when it returns) and ``loss() -> float``
(the last step's loss).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LR = 1e-3


@dataclass(frozen=True)
class Model:
    """An MLP ``dims[0] -> ... -> dims[-1]`` (ReLU between layers) trained on batches of
    ``batch``; ``data`` is ``digits`` (scikit-learn's, 64 features) or ``synthetic``."""

    key: str
    dims: tuple[int, ...]
    batch: int
    data: str

    @property
    def label(self) -> str:
        what = "scikit-learn digits" if self.data == "digits" else "synthetic"
        return f"MLP {'-'.join(map(str, self.dims))}, batch {self.batch} ({what})"


def parse_model(key: str, text: str, data: str) -> Model:
    """``"64-128-10:64"`` -> Model(dims=(64, 128, 10), batch=64)."""
    try:
        dims_s, batch_s = text.split(":")
        dims = tuple(int(d) for d in dims_s.split("-"))
        batch = int(batch_s)
    except ValueError:
        raise ValueError(f"--{key}: expected DIMS:BATCH such as 64-128-10:64, got {text!r}") from None
    if len(dims) < 2 or min(dims) < 1 or batch < 1:
        raise ValueError(f"--{key}: need at least two positive dims and a positive batch, got {text!r}")
    if data == "digits" and dims[0] != 64:
        raise ValueError(f"--{key}: the digits have 64 features, the model takes {dims[0]}")
    return Model(key, dims, batch, data)


def make_data(m: Model, batches: int = 8, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``batches`` minibatches (float32 features, int64 labels), cycled through by every system."""
    rng = np.random.default_rng(seed)
    if m.data == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x_all = (d.data / 16).astype(np.float32)
        y_all = d.target.astype(np.int64) % m.dims[-1]
        order = rng.permutation(len(x_all))
        x_all, y_all = x_all[order], y_all[order]
        n = len(x_all) // m.batch
        return [(x_all[i * m.batch:(i + 1) * m.batch], y_all[i * m.batch:(i + 1) * m.batch])
                for i in range(min(n, batches))]
    return [(rng.standard_normal((m.batch, m.dims[0]), dtype=np.float32),
             rng.integers(0, m.dims[-1], m.batch).astype(np.int64)) for _ in range(batches)]


def init_weights(m: Model, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight (out, in), bias (out,)) per layer, torch's Linear init."""
    rng = np.random.default_rng(seed)
    out = []
    for fan_in, fan_out in zip(m.dims, m.dims[1:]):
        bound = 1.0 / math.sqrt(fan_in)
        out.append((rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                    rng.uniform(-bound, bound, fan_out).astype(np.float32)))
    return out


class NumpyByHand:
    """Forward, backward and Adam written out in numpy: the floor of the machine."""

    name = "numpy by hand"

    def __init__(self, m: Model, weights: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.params = [p.copy() for wb in weights for p in wb]
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]
        self.t = 0
        self._loss = float("nan")

    def step(self, x: np.ndarray, y: np.ndarray) -> None:
        acts = [x]
        ws = self.params
        n_layers = len(ws) // 2
        for i in range(n_layers):
            z = acts[-1] @ ws[2 * i].T + ws[2 * i + 1]
            acts.append(np.maximum(z, 0) if i < n_layers - 1 else z)
        logits = acts[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        s = e.sum(axis=1, keepdims=True)
        b = len(y)
        self._loss = float((np.log(s[:, 0]) - shifted[np.arange(b), y]).mean())
        g = e / s
        g[np.arange(b), y] -= 1
        g /= b
        grads: list[np.ndarray] = [np.empty(0)] * len(ws)
        for i in reversed(range(n_layers)):
            grads[2 * i] = g.T @ acts[i]
            grads[2 * i + 1] = g.sum(axis=0)
            if i:
                g = (g @ ws[2 * i]) * (acts[i] > 0)
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, gr, mm, vv in zip(ws, grads, self.m, self.v):
            mm *= b1
            mm += (1 - b1) * gr
            vv *= b2
            vv += (1 - b2) * gr * gr
            p -= LR * (mm / c1) / (np.sqrt(vv / c2) + eps)

    def loss(self) -> float:
        return self._loss


class Torch:
    """``nn.Sequential``, ``torch.optim.Adam``, ``F.cross_entropy`` on the CPU."""

    name = "PyTorch CPU"

    def __init__(self, m: Model, weights: list[tuple[np.ndarray, np.ndarray]]) -> None:
        import torch

        layers: list[Any] = []
        for i, (w, b) in enumerate(weights):
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w))
                lin.bias.copy_(torch.from_numpy(b))
            layers.append(lin)
            if i < len(weights) - 1:
                layers.append(torch.nn.ReLU())
        self.torch = torch
        self.model = torch.nn.Sequential(*layers)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)
        self._loss: Any = None

    def step(self, x: np.ndarray, y: np.ndarray) -> None:
        F = self.torch.nn.functional
        loss = F.cross_entropy(self.model(self.torch.from_numpy(x)), self.torch.from_numpy(y))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self._loss = loss

    def loss(self) -> float:
        return float(self._loss.item())


class Triplane:
    """The same code with ``import triplane as tp``: in-process (the embedded session), or
    on a local cluster when ``cluster`` is given (``tp.connect`` to it)."""

    def __init__(self, m: Model, weights: list[tuple[np.ndarray, np.ndarray]],
                 cluster: TriplaneCluster | None = None) -> None:
        import triplane as tp
        from triplane import nn, optim

        self.tp = tp
        self.cluster = cluster
        self.name = "triplane, local cluster of 2" if cluster else "triplane in-process"
        layers: list[Any] = []
        for i, (w, b) in enumerate(weights):
            lin = nn.Linear(w.shape[1], w.shape[0])
            lin.weight.assign(w)
            lin.bias.assign(b)
            layers.append(lin)
            if i < len(weights) - 1:
                layers.append(nn.ReLU())
        self.model = nn.Sequential(*layers)
        self.opt = optim.Adam(self.model.parameters(), lr=LR)
        self.F = nn.functional
        self._loss: Any = None

    def step(self, x: np.ndarray, y: np.ndarray) -> None:
        tp = self.tp
        with self._session():
            loss = self.F.cross_entropy(self.model(tp.tensor(x)), tp.tensor(y))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()  # one graph run: the loss, the gradients and the updates
        self._loss = loss

    def loss(self) -> float:
        return float(self._loss.item())

    def stats(self) -> dict[str, Any]:
        """The session's counters (plan cache, trace cache), when it has any."""
        from triplane.sdk.session import current_session

        with self._session():
            s = current_session()
        counters = getattr(s, "counters", None)
        return dict(counters()) if callable(counters) else {}

    def _session(self) -> Any:
        from contextlib import nullcontext

        from triplane.sdk.session import use_session

        return use_session(self.cluster.session) if self.cluster else nullcontext()


class TriplaneCluster:
    """``LocalCluster`` of ``executors`` executors (``memory`` each, one BLAS thread) in a
    temporary run directory and a ``RemoteSession`` to it; ``close()`` stops everything."""

    def __init__(self, executors: int, memory: str) -> None:
        from triplane.launcher.cluster import ClusterConfig, LocalCluster
        from triplane.sdk.remote import RemoteSession

        self.home = Path(tempfile.mkdtemp(prefix="triplane-train-"))
        self.cluster = LocalCluster(self.home, ClusterConfig(executors=executors, memory=memory),
                                    env={k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                          "MKL_NUM_THREADS")})
        self.session: Any = None
        try:
            self.cluster.start()
            self.session = RemoteSession(self.cluster.url, self.cluster.token, timeout_s=120.0,
                                         job_timeout_s=300.0)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        import os
        import shutil
        from contextlib import suppress

        with suppress(Exception):
            if self.session is not None:
                self.session.close()
        self.cluster.stop()
        self.cluster.run.clear_cluster()
        if os.environ.get("BENCH_KEEP_HOME") != "1":
            shutil.rmtree(self.home, ignore_errors=True)
