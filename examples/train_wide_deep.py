"""Train Wide&Deep on synthetic click data, then serve it.

    python examples/train_wide_deep.py [--epochs 6] [--serve wide_deep.tpm]

The data (synthetic, seeded): users and items with hidden 8-dimensional tastes, four dense
features per impression (think price, position, recency, hour), and a click drawn with
probability sigmoid(taste match + dense weights + a bias per (user group, item group)
pair). Wide&Deep (Cheng et al. 2016) has a part for each kind of signal:

* wide: a learnt weight per crossed feature (the user group x item group id, computed in
  the model from the two ids) plus a linear term of the dense features, which memorises
  the per-pair biases;
* deep: user and item embeddings with the dense features through an MLP, which
  generalises the taste match.

Their logits add up; training minimises cross entropy with Adam. The score is the
held-out AUC beside the AUC of the true click probabilities (the best any model can do);
20,000 impressions and 6 epochs took 35 s on 2 cores here: AUC 0.886, the true one 0.913.

``--serve FILE`` saves the model that answers click probabilities (``user`` and ``item``
int64 (batch,), ``dense`` float32 (batch, 4) in; ``click_probability`` (batch,) out),
serves it in this process (``tp.serve``, docs/serving.md) and scores the held-out
impressions through ``POST /v1/predict``.
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Callable

import numpy as np
from triplane.nn import functional as F

import triplane as tp
from triplane import nn, optim

USERS, ITEMS, DENSE, GROUPS = 500, 200, 4, 8


def make_data(n: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(inputs, clicks, true click probabilities) of ``n`` impressions. The hidden world
    (tastes, weights, pair biases) depends on nothing but a fixed seed, so train and test
    sets drawn with other seeds share it."""
    world = np.random.default_rng(1234)
    taste_u = world.standard_normal((USERS, 8)) / 2
    taste_i = world.standard_normal((ITEMS, 8)) / 2
    w_dense = world.standard_normal(DENSE)
    pair = world.standard_normal((GROUPS, GROUPS)) * 1.5
    rng = np.random.default_rng(seed)
    user, item = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    match = (taste_u[user] * taste_i[item]).sum(1)
    logit = match + dense @ w_dense + pair[user % GROUPS, item % GROUPS] - 0.5
    p = 1 / (1 + np.exp(-logit))
    clicks = (rng.random(n) < p).astype(np.int64)
    return {"user": user, "item": item, "dense": dense}, clicks, p


class WideDeep(nn.Module):
    """Two-class logits (no click, click) of each impression."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.cross = nn.Embedding(GROUPS * GROUPS, 2)  # wide: one weight pair per crossed id
        self.wide_dense = nn.Linear(DENSE, 2)
        self.users, self.items = nn.Embedding(USERS, dim), nn.Embedding(ITEMS, dim)
        self.deep = nn.Sequential(nn.Linear(2 * dim + DENSE, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                  nn.Linear(32, 2))

    def forward(self, user: tp.Tensor, item: tp.Tensor, dense: tp.Tensor) -> tp.Tensor:
        crossed = (user % GROUPS) * GROUPS + item % GROUPS
        wide = self.cross(crossed) + self.wide_dense(dense)
        deep = self.deep(tp.concat([self.users(user) * 0.1, self.items(item) * 0.1, dense], axis=1))
        return wide + deep


class ClickProbability(nn.Module):
    """What is served: the probability of a click."""

    def __init__(self, model: WideDeep) -> None:
        super().__init__()
        self.model = model

    def forward(self, user: tp.Tensor, item: tp.Tensor, dense: tp.Tensor) -> tp.Tensor:
        return F.softmax(self.model(user, item, dense), -1)[:, 1]


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (the rank statistic; ties count half)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    ordered = np.sort(scores)
    for s in np.unique(ordered[1:][np.diff(ordered) == 0]):  # tied scores share their mean rank
        ranks[scores == s] = ranks[scores == s].mean()
    pos = labels == 1
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum()))


def train(model: WideDeep, inputs: dict[str, np.ndarray], clicks: np.ndarray, epochs: int = 6,
          batch_size: int = 256, lr: float = 1e-2, seed: int = 0, log: Callable[[str], None] | None = print
          ) -> None:
    opt = optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    n = len(clicks) // batch_size * batch_size  # whole batches: one compiled step
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(clicks))[:n]
        total = 0.0
        for i in range(0, n, batch_size):
            at = order[i:i + batch_size]
            logits = model(*(tp.tensor(inputs[k][at]) for k in ("user", "item", "dense")))
            loss = F.cross_entropy(logits, tp.tensor(clicks[at]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        if log is not None:
            log(f"epoch {epoch}  loss {total / (n // batch_size):.4f}")


def probabilities(model: WideDeep, inputs: dict[str, np.ndarray]) -> np.ndarray:
    model.eval()
    with tp.no_grad():
        return ClickProbability(model)(*(tp.tensor(inputs[k]) for k in ("user", "item", "dense"))).numpy()


def serve_and_score(model: WideDeep, path: str, inputs: dict[str, np.ndarray], batch: int = 128
                    ) -> np.ndarray:
    """Save the click-probability model to ``path``, serve it on a free port and score
    ``inputs`` over HTTP."""
    import httpx

    model.eval()
    example = [inputs[k][:2] for k in ("user", "item", "dense")]
    tp.save_model(ClickProbability(model), example, path,
                  names={"inputs": ["user", "item", "dense"], "outputs": ["click_probability"]})
    token = secrets.token_hex(16)
    server = tp.serve(path, embedded=True, port=0, max_batch=batch, admin_token=token, block=False)
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as client:
            out = []
            for i in range(0, len(inputs["user"]), batch):
                body = {"inputs": {k: v[i:i + batch].tolist() for k, v in inputs.items()}}
                r = client.post("/v1/predict", json=body)
                r.raise_for_status()
                out.append(np.asarray(r.json()["outputs"]["click_probability"], np.float32))
    finally:
        server.stop()
    return np.concatenate(out)


def run(n_train: int = 20_000, epochs: int = 6, seed: int = 0, log: Callable[[str], None] | None = print
        ) -> tuple[WideDeep, dict[str, np.ndarray], np.ndarray, float, float]:
    """Train; (model, test inputs, test clicks, test AUC, the true probabilities' AUC)."""
    tp.manual_seed(seed)
    inputs, clicks, _ = make_data(n_train, seed)
    model = WideDeep()
    train(model, inputs, clicks, epochs, seed=seed, log=log)
    test, test_clicks, p = make_data(4000, seed + 1)
    return model, test, test_clicks, auc(probabilities(model, test), test_clicks), auc(p, test_clicks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=20_000, help="training impressions")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve", metavar="FILE", help="save a model file here, serve it, score over HTTP")
    args = ap.parse_args()
    t0 = time.perf_counter()
    model, test, clicks, model_auc, best = run(args.train, args.epochs, args.seed)
    print(f"held-out AUC {model_auc:.4f} (the true probabilities': {best:.4f}; "
          f"{time.perf_counter() - t0:.1f}s)")
    if args.serve:
        served = serve_and_score(model, args.serve, test)
        np.testing.assert_allclose(served, probabilities(model, test), rtol=1e-5, atol=1e-6)
        print(f"served {args.serve}: held-out AUC over HTTP {auc(served, clicks):.4f}")


if __name__ == "__main__":
    main()
