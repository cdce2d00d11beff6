"""Train an MLP on 8x8 digits with Adam, printing loss and accuracy (runs in seconds).

    python examples/train_mlp.py [--epochs 10] [--seed 0]

Uses scikit-learn's bundled digits (nothing is downloaded; scikit-learn must be
installed, or pass --synthetic for a deterministic seven-segment stand-in).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import triplane as tp
from triplane.sdk import nn
from triplane.sdk.data import DataLoader, datasets
from triplane.sdk.nn import functional as F
from triplane.sdk.optim import Adam


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    pred = model(tp.Tensor.from_array(x)).argmax(axis=1).numpy()
    model.train()
    return float((pred == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--synthetic", action="store_true", help="synthetic digits instead of scikit-learn's")
    args = ap.parse_args()

    tp.manual_seed(args.seed)
    images, labels = datasets.digits(seed=args.seed, synthetic=args.synthetic)
    x = (images.reshape(len(images), -1) / 16.0).astype(np.float32)
    n_train = int(0.8 * len(x))
    x_train, y_train, x_test, y_test = x[:n_train], labels[:n_train], x[n_train:], labels[n_train:]

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))
    opt = Adam(model.parameters(), lr=3e-3)
    loader = DataLoader(x_train, y_train, batch_size=64, shuffle=True, seed=args.seed)
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        total = 0.0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step(loss)
            total += loss.item() * len(yb)
        train_acc, test_acc = accuracy(model, x_train, y_train), accuracy(model, x_test, y_test)
        print(f"epoch {epoch:3d}  loss {total / n_train:.4f}  train acc {train_acc:.3f}  "
              f"test acc {test_acc:.3f}")
    print(f"done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
