"""The train-then-serve examples, run small: the Transformer encoder that sorts digits
(examples/train_transformer_sort.py) and Wide&Deep on synthetic clicks
(examples/train_wide_deep.py) learn their task, and the model served over HTTP answers
what the model answers in this process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_transformer_sorts_and_serves_the_same(tmp_path: Path) -> None:
    ex = _example("train_transformer_sort")
    model, tokens, _ = ex.run(steps=200, length=6, seed=0, log=None)
    assert tokens >= 0.9, f"token accuracy {tokens:.3f} after 200 steps"
    x, y = ex.batch(np.random.default_rng(7), 40, 6)
    served = ex.serve_and_sort(model, str(tmp_path / "sort.tpm"), x)
    np.testing.assert_array_equal(served, ex.predict(model, x))
    assert (served == y).mean() >= 0.9


def test_wide_and_deep_learns_clicks_and_serves_the_same(tmp_path: Path) -> None:
    ex = _example("train_wide_deep")
    assert ex.auc(np.array([0.1, 0.4, 0.4, 0.8]), np.array([0, 0, 1, 1])) == 0.875  # a tie counts half
    model, test, _, model_auc, best = ex.run(n_train=4000, epochs=2, seed=0, log=None)
    assert model_auc >= 0.7 and model_auc <= best + 0.02, (model_auc, best)
    few = {k: v[:300] for k, v in test.items()}
    served = ex.serve_and_score(model, str(tmp_path / "wd.tpm"), few, batch=100)
    np.testing.assert_allclose(served, ex.probabilities(model, few), rtol=1e-5, atol=1e-6)
