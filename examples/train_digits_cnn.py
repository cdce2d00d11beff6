"""Train a LeNet-style CNN on scikit-learn's 8x8 digits, in this process (12 epochs: about
30 s on 2 cores; test accuracy about 98%) or on a local cluster.

    python examples/train_digits_cnn.py [--epochs 12] [--seed 0] [--workers 1] [--save cnn.npz]
    python examples/train_digits_cnn.py --cluster [--executors 2] [--kill-executor-at 2]
    python examples/train_digits_cnn.py --serve cnn.tpm   # then serve it and predict over HTTP

``--cluster`` starts a temporary local cluster (a scheduler and ``--executors`` executors
in a throw-away run directory, stopped at the end), ``tp.connect``s to it and trains there
(a progress bar shows on a terminal for jobs over about a second).
``--kill-executor-at EPOCH`` SIGKILLs executor 0 a second into that epoch, while its steps
run: the scheduler moves the dead executor's tasks to the live one, recomputes the tiles
lost with it, and the run finishes with the same accuracy.

The data: the 1,797 8x8 grey images of handwritten digits that scikit-learn ships (no
download; scikit-learn must be installed), split 80/20 by a seeded permutation.

It uses the whole training kit: a seeded DataLoader with augmentation (a random crop of
the image padded by one pixel) and normalisation, AdamW with a linear warm-up and then
a cosine decay of the learning rate (stepped every batch), the CrossEntropyLoss module
with label smoothing, ``tp.no_grad()`` for evaluation and ``tp.save`` of the model,
optimiser and schedule. ``build_model``, ``load_data``, ``train`` and ``evaluate`` are
plain functions so that other programs (a cluster variant, the tests) reuse them.

``--serve FILE`` then saves the trained model as a model file (``tp.save_model``: graph,
parameters and signature, no pickle), serves it (``tp.serve``, in this process; the
model server of docs/serving.md) and sends the test images to ``POST /v1/predict`` in
batches of 32 over HTTP: the served accuracy is the in-process one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.progress import Progress, TextColumn

import triplane as tp
from triplane import data, nn, optim

MEAN, STD = 0.305, 0.378  # of the digits' pixels scaled to [0, 1]
StepHook = Callable[[int, int, int, float], None]  # (epoch, batch, batches per epoch, loss)


def load_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images (N, 1, 8, 8) float32 in [0, 1]."""
    images, labels = data.datasets.digits()
    x = (images / 16.0).astype(np.float32)[:, None]
    order = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.8 * len(x))
    tr, te = order[:n_train], order[n_train:]
    return x[tr], labels[tr], x[te], labels[te]


def build_model() -> nn.Module:
    """Two conv/ReLU/max-pool stages (8x8 -> 4x4 -> 2x2) and two linear layers."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10),
    )


normalize = data.transforms.Normalize(MEAN, STD)


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of ``model`` on images ``x`` (as ``load_data`` gives them)."""
    model.eval()
    with tp.no_grad():
        pred = model(tp.tensor(normalize(x))).argmax(axis=1).numpy()
    model.train()
    return float((pred == y).mean())


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int = 12, seed: int = 0,
          batch_size: int = 64, lr: float = 1e-2, workers: int = 0,
          on_epoch: Callable[[int, float, dict[str, Any]], None] | None = None,
          on_step: StepHook | None = None) -> dict[str, Any]:
    """Train in place; ``on_epoch(epoch, mean loss, checkpoint)`` after each epoch, where
    the checkpoint is the state dicts to ``tp.save``; ``on_step(epoch, batch, batches,
    loss)`` after each step. Returns the last checkpoint."""
    augment = data.transforms.Compose([data.transforms.RandomCrop(8, padding=1), normalize])
    loader = data.DataLoader(x, y, batch_size=batch_size, shuffle=True, seed=seed, transform=augment,
                        num_workers=workers)
    opt = optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    warmup = optim.LinearLR(opt, start_factor=0.1, total_iters=len(loader))
    decay = optim.CosineAnnealingLR(opt, T_max=max(epochs - 1, 1) * len(loader))
    sched = optim.SequentialLR(opt, [warmup, decay], milestones=[len(loader)])
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
    checkpoint: dict[str, Any] = {}
    for epoch in range(1, epochs + 1):
        total = 0.0
        for batch, (xb, yb) in enumerate(loader, 1):
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            value = loss.item()
            total += value * len(yb)
            if on_step is not None:
                on_step(epoch, batch, len(loader), value)
        checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "scheduler": sched.state_dict(), "epoch": epoch}
        if on_epoch is not None:
            on_epoch(epoch, total / len(x), checkpoint)
    return checkpoint


def serve_and_score(model: nn.Module, path: str, x: np.ndarray, y: np.ndarray,
                    batch: int = 32) -> float:
    """Save ``model`` to the model file ``path``, serve it on a free port and score the
    images ``x`` (as ``load_data`` gives them) through ``POST /v1/predict``."""
    import secrets

    import httpx

    model.eval()
    tp.save_model(model, [normalize(x[:2])], path, names={"inputs": ["image"], "outputs": ["logits"]})
    token = secrets.token_hex(16)
    server = tp.serve(path, embedded=True, port=0, admin_token=token, block=False)
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as client:
            preds = []
            for i in range(0, len(x), batch):
                r = client.post("/v1/predict", json={"inputs": {"image": normalize(x[i:i + batch]).tolist()}})
                r.raise_for_status()
                preds.append(np.asarray(r.json()["outputs"]["logits"]).argmax(axis=1))
    finally:
        server.stop()
    return float((np.concatenate(preds) == y).mean())


def run(epochs: int = 12, seed: int = 0, workers: int = 0,
        on_epoch: Callable[[int, float, dict[str, Any]], None] | None = None,
        lr: float = 1e-2, on_step: StepHook | None = None) -> tuple[nn.Module, float]:
    """Load the data, build and train the model; returns it and its test accuracy."""
    tp.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_data(seed)
    model = build_model()
    train(model, x_train, y_train, epochs=epochs, seed=seed, lr=lr, workers=workers, on_epoch=on_epoch,
          on_step=on_step)
    return model, evaluate(model, x_test, y_test)


def run_on_cluster(epochs: int = 12, seed: int = 0, workers: int = 0, executors: int = 2,
                   kill_executor_at: int | None = None,
                   on_epoch: Callable[[int, float, dict[str, Any]], None] | None = None,
                   log: Callable[[str], None] = print, lr: float = 1e-2,
                   kill_after_s: float = 1.0, on_step: StepHook | None = None) -> tuple[nn.Module, float]:
    """:func:`run` on a temporary local cluster of ``executors`` executors; with
    ``kill_executor_at`` (2 or more), executor 0 is SIGKILLed ``kill_after_s`` into that
    epoch, from another thread, while the epoch's steps run."""
    if kill_executor_at is not None and kill_executor_at < 2:
        raise ValueError("kill_executor_at must be an epoch from 2 on (the first compiles the steps)")
    import signal
    import tempfile
    import threading

    from triplane.launcher import ClusterConfig, LocalCluster

    with tempfile.TemporaryDirectory(prefix="triplane-cnn-") as home:
        cluster = LocalCluster(home, ClusterConfig(executors=executors, memory="512MiB", log_level="warning"))
        cluster.start()
        try:
            log(f"cluster: {cluster.url}, {executors} executors (run dir {home})")
            tp.connect(cluster.url, cluster.token, job_timeout_s=120)

            def kill() -> None:
                pid = cluster.kill_executor(0, signal.SIGKILL)
                log(f"SIGKILLed executor-0 (pid {pid}) during epoch {kill_executor_at}")

            def epoch_end(epoch: int, loss: float, checkpoint: dict[str, Any]) -> None:
                if on_epoch is not None:
                    on_epoch(epoch, loss, checkpoint)
                if kill_executor_at is not None and epoch == kill_executor_at - 1:
                    timer = threading.Timer(kill_after_s, kill)  # while the next steps' jobs run
                    timer.daemon = True
                    timer.start()

            return run(epochs, seed, workers, on_epoch=epoch_end, lr=lr, on_step=on_step)
        finally:
            tp.disconnect()
            cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="threads preparing batches (0: none)")
    ap.add_argument("--save", help="write the last checkpoint here (a .npz file, no pickle)")
    ap.add_argument("--cluster", action="store_true", help="train on a temporary local cluster")
    ap.add_argument("--executors", type=int, default=2, help="executors of that cluster")
    ap.add_argument("--kill-executor-at", type=int, metavar="EPOCH",
                    help="with --cluster: SIGKILL executor 0 a second into this epoch (>= 2)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--serve", metavar="FILE", help="save a model file here, serve it and score the test "
                    "images over HTTP")
    args = ap.parse_args()
    t0 = time.perf_counter()
    last: dict[str, Any] = {}
    # A progress bar over the steps on a terminal (rich; plain epoch lines otherwise).
    bar = Progress(*Progress.get_default_columns(), TextColumn("{task.fields[info]}"),
                   disable=not sys.stderr.isatty(), transient=True)
    task = bar.add_task("training", total=None, info="")
    say = bar.console.print if sys.stderr.isatty() else print  # above the bar; plain lines without one

    def report(epoch: int, loss: float, checkpoint: dict[str, Any]) -> None:
        last.update(checkpoint)
        say(f"epoch {epoch:3d}  loss {loss:.4f}  {time.perf_counter() - t0:6.1f}s")

    def step(epoch: int, batch: int, batches: int, loss: float) -> None:
        bar.update(task, total=args.epochs * batches, completed=(epoch - 1) * batches + batch,
                   description=f"epoch {epoch}/{args.epochs}", info=f"loss {loss:.4f}")

    with bar:
        if args.cluster:
            model, accuracy = run_on_cluster(args.epochs, args.seed, args.workers, args.executors,
                                         args.kill_executor_at, on_epoch=report, lr=args.lr,
                                         log=say, on_step=step)
        else:
            model, accuracy = run(args.epochs, args.seed, args.workers, on_epoch=report, lr=args.lr,
                                  on_step=step)
    print(f"test accuracy {accuracy:.4f}  ({time.perf_counter() - t0:.1f}s)")
    if args.save:
        tp.save(last, args.save)
        print(f"saved {args.save}")
    if args.serve:
        _, _, x_test, y_test = load_data(args.seed)
        served = serve_and_score(model, args.serve, x_test, y_test)
        print(f"served {args.serve}: test accuracy over HTTP {served:.4f}")


if __name__ == "__main__":
    main()
