"""The training kit end to end: examples/train_digits_cnn.py's LeNet-style CNN on
scikit-learn's digits reaches >= 97% test accuracy in this process, and its checkpoint
(tp.save of model, optimiser and schedule) reloads into a fresh model that scores the same;
through a local cluster of 2 with one executor SIGKILLed mid-training it reaches the same
accuracy (slow)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import triplane as tp

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits_cnn.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_digits_cnn", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_cnn_on_digits_reaches_97_percent(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="the digits come from scikit-learn (pip install scikit-learn)")
    ex = _example()
    losses: list[float] = []
    last: dict[str, Any] = {}

    def on_epoch(epoch: int, loss: float, checkpoint: dict[str, Any]) -> None:
        losses.append(loss)
        last.update(checkpoint)

    t0 = time.perf_counter()
    _, accuracy = ex.run(epochs=12, seed=0, workers=1, on_epoch=on_epoch)
    elapsed = time.perf_counter() - t0
    assert accuracy >= 0.97, f"test accuracy {accuracy:.4f} after {elapsed:.0f}s, losses {losses}"
    assert losses[-1] < 0.5 * losses[0], f"losses {losses}"

    path = tmp_path / "cnn.npz"
    tp.save(last, path)
    ck = tp.load(path)
    assert ck["epoch"] == 12 and sorted(ck) == ["epoch", "model", "optimizer", "scheduler"]
    model = ex.build_model()
    model.load_state_dict(ck["model"])
    _, _, x_test, y_test = ex.load_data(0)
    assert ex.evaluate(model, x_test, y_test) == accuracy


@pytest.mark.slow  # about 1.5 min on 2 loaded cores (about 0.3 s per step on the cluster)
def test_cnn_on_a_cluster_survives_a_sigkilled_executor() -> None:
    """The same CNN trained through a local cluster of 2 executors, executor 0 SIGKILLed
    a second into epoch 4 of 8 (while steps run): the scheduler moves the work to the live
    executor (and recomputes what was lost with it), and the run reaches the in-process
    run's accuracy, >= 97%."""
    pytest.importorskip("sklearn", reason="the digits come from scikit-learn (pip install scikit-learn)")
    ex = _example()
    log: list[str] = []
    losses: list[float] = []
    t0 = time.perf_counter()
    _, accuracy = ex.run_on_cluster(epochs=8, lr=0.02, seed=0, executors=2, kill_executor_at=4,
                                    on_epoch=lambda e, loss, ck: losses.append(loss), log=log.append)
    elapsed = time.perf_counter() - t0
    assert any("SIGKILLed executor-0" in line for line in log), log
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0], losses
    assert accuracy >= 0.97, f"test accuracy {accuracy:.4f} after {elapsed:.0f}s, losses {losses}"
    _, in_process = ex.run(epochs=8, lr=0.02, seed=0)
    assert abs(accuracy - in_process) <= 2 / 360, (accuracy, in_process)  # BLAS may sum in another order


def test_the_trained_cnn_served_over_http_scores_the_same(tmp_path: Path) -> None:
    """Train briefly, save a model file, serve it and score the test set through
    POST /v1/predict: the same accuracy as in this process (examples/train_digits_cnn.py --serve)."""
    pytest.importorskip("sklearn", reason="the digits come from scikit-learn (pip install scikit-learn)")
    ex = _example()
    model, accuracy = ex.run(epochs=2, seed=0)
    _, _, x_test, y_test = ex.load_data(0)
    served = ex.serve_and_score(model, str(tmp_path / "cnn.tpm"), x_test, y_test)
    assert served == accuracy and accuracy > 0.5, (served, accuracy)
    assert tp.load_model(tmp_path / "cnn.tpm").signature.inputs[0].shape == (None, 1, 8, 8)
