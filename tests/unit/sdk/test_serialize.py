"""tp.save / tp.load: model and optimiser state dicts round-trip exactly; nothing that
needs pickle is written or read."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import triplane as tp
from triplane.sdk import nn, optim
from triplane.sdk.nn import functional as F
from triplane.testing import assert_close


def _train(model: nn.Module, opt: optim.Optimizer, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = tp.tensor(rng.standard_normal((8, 4)).astype(np.float32))
        y = tp.tensor(rng.integers(0, 3, size=8))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def test_model_and_optimizer_round_trip_and_training_resumes_exactly(tmp_path: Path) -> None:
    tp.manual_seed(1)
    model = _model()
    opt = optim.AdamW(model.parameters(), lr=0.01, amsgrad=True)
    sched = optim.StepLR(opt, step_size=2, gamma=0.5)
    _train(model, opt, 3, seed=0)
    sched.step()
    path = tmp_path / "ckpt.npz"
    tp.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
             "epoch": 3, "note": None}, path)

    tp.manual_seed(2)  # different initial weights
    model2 = _model()
    opt2 = optim.AdamW(model2.parameters(), lr=0.5)
    sched2 = optim.StepLR(opt2, step_size=99)
    ck = tp.load(path)
    assert ck["epoch"] == 3 and ck["note"] is None
    assert isinstance(ck["opt"]["param_groups"][0]["betas"], tuple)
    assert sorted(ck["opt"]["state"]) == [0, 1, 2, 3]  # int keys stay ints
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    sched2.load_state_dict(ck["sched"])
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    _train(model, opt, 2, seed=5)
    _train(model2, opt2, 2, seed=5)
    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert_close(b, a, rtol=0, atol=0, what=name)


def test_dtypes_survive(tmp_path: Path) -> None:
    import ml_dtypes

    sd = {"bf": np.arange(4, dtype=ml_dtypes.bfloat16), "i8": np.arange(3, dtype=np.int8),
          "b": np.array([True, False]), "scalar": np.float32(1.5), "t": tp.tensor(np.ones((2, 2)))}
    tp.save(sd, tmp_path / "d.npz")
    back = tp.load(tmp_path / "d.npz")
    assert back["bf"].dtype == ml_dtypes.bfloat16 and back["bf"].tolist() == [0, 1, 2, 3]
    assert back["i8"].dtype == np.int8 and back["b"].dtype == np.bool_
    assert back["scalar"].shape == () and back["t"].dtype == np.float64


def test_plain_npz_of_a_state_dict_loads(tmp_path: Path) -> None:
    model = _model()
    np.savez(tmp_path / "plain.npz", **model.state_dict())
    model.load_state_dict(tp.load(tmp_path / "plain.npz"))


def test_pickled_payloads_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an .npz whose entry is a pickled object array (np.savez pickles object arrays)
    evil = tmp_path / "evil.npz"
    np.savez(evil, w=np.array([{"x": 1}], dtype=object))
    # a raw pickle under an .npz name
    raw = tmp_path / "raw.npz"
    raw.write_bytes(pickle.dumps({"w": np.ones(2)}))

    def no_unpickling(*a: object, **k: object) -> None:
        raise AssertionError("tp.load unpickled something")

    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    for path in (evil, raw):
        with pytest.raises(ValueError, match="pickled data, which is never loaded"):
            tp.load(path)


def test_what_cannot_be_saved_or_loaded(tmp_path: Path) -> None:
    model = _model()
    with pytest.raises(TypeError, match=r"the object is a Sequential \(save its state_dict\(\)\)"):
        tp.save(model, tmp_path / "m.npz")
    with pytest.raises(TypeError, match=r"the object\['f'\] is a function"):
        tp.save({"f": lambda: 0}, tmp_path / "m.npz")
    with pytest.raises(TypeError, match="dtype object"):
        tp.save({"o": np.array([None], dtype=object)}, tmp_path / "m.npz")
    assert not (tmp_path / "m.npz").exists()
    with pytest.raises(ValueError, match=r"unknown format.*'\*\.npz'"):
        tp.save(model.state_dict(), tmp_path / "m.pt")
    (tmp_path / "x.pt").write_bytes(b"anything")
    with pytest.raises(ValueError, match="unknown format"):
        tp.load(tmp_path / "x.pt")
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match=r"not a \.npz state file|pickled"):
        tp.load(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError):
        tp.load(tmp_path / "missing.npz")


def test_strict_load_names_missing_and_unexpected_keys() -> None:
    model = _model()
    sd = model.state_dict()
    sd["extra.weight"] = sd.pop("0.bias")
    with pytest.raises(KeyError, match=r"missing \['0.bias'\], unexpected \['extra.weight'\]"):
        model.load_state_dict(sd)
    model.load_state_dict(sd, strict=False)


def test_safetensors_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("safetensors", reason="safetensors is not installed (the .npz format is tested)")
    model = _model()
    opt = optim.Adam(model.parameters(), lr=0.01)
    _train(model, opt, 2, seed=0)
    path = tmp_path / "ckpt.safetensors"
    tp.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    ck = tp.load(path)
    assert sorted(ck["opt"]["state"]) == [0, 1, 2, 3] and ck["opt"]["param_groups"][0]["lr"] == 0.01
    for name, want in model.state_dict().items():
        assert_close(ck["model"][name], want, rtol=0, atol=0, what=name)
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="not a safetensors file"):
        tp.load(tmp_path / "bad.safetensors")


def test_safetensors_without_the_package_says_how_to_install(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match="pip install safetensors"):
        tp.save({"w": np.ones(2)}, tmp_path / "w.safetensors")
