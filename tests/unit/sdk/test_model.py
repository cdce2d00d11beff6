"""tp.save_model / tp.load_model: a trained model comes back with the same outputs, the
batch is dynamic when the graph allows it, and bad inputs and files are refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import triplane as tp
from triplane.sdk.nn import functional as F


def _cnn() -> tp.nn.Module:
    tp.manual_seed(0)
    return tp.nn.Sequential(
        tp.nn.Conv2d(1, 4, 3, padding=1), tp.nn.ReLU(), tp.nn.MaxPool2d(2), tp.nn.Flatten(),
        tp.nn.Linear(4 * 4 * 4, 10))


def _train(model: tp.nn.Module, steps: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=16)
    opt = tp.optim.SGD(model.parameters(), lr=0.1)
    before = model.state_dict()["4.weight"].copy()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(tp.tensor(x)), tp.tensor(y)).backward()
        opt.step()
    assert not np.allclose(model.state_dict()["4.weight"], before)  # it did train
    return x, y


def test_train_save_load_gives_the_same_outputs(tmp_path: Path) -> None:
    model = _cnn()
    x, _ = _train(model)
    model.train()
    saved = tp.save_model(model, x[:4], tmp_path / "cnn.tpm")
    assert model.training  # the mode is restored after tracing
    loaded = tp.load_model(tmp_path / "cnn.tpm")
    assert loaded.digest == saved.digest and loaded.version == 1
    assert sorted(loaded.params) == sorted(model.state_dict())
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(loaded.params[k], v)
    (spec,) = loaded.signature.inputs
    assert spec == tp.TensorSpec("x", "float32", (None, 1, 8, 8))
    assert loaded.signature.outputs == [tp.TensorSpec("output", "float32", (None, 10))]
    model.eval()
    for batch in (4, 1, 16):  # traced at 4; the batch is dynamic
        want = model(tp.tensor(x[:batch])).numpy()
        got = loaded(x[:batch])
        assert isinstance(got, tp.Tensor)
        np.testing.assert_array_equal(got.numpy(), want)
    assert loaded.graph.hash() == saved.graph.hash()


def test_batch_dependent_attributes_follow_the_batch(tmp_path: Path) -> None:
    w = tp.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))

    def f(a: tp.Tensor, b: tp.Tensor) -> tuple[tp.Tensor, tp.Tensor]:
        n = a.shape[0]
        h = (a @ w.T).reshape(n, 3, 1) + tp.zeros((n, 3, 2))
        return h.reshape(n * 6), (h.sum() + b.sum())

    a, b = np.ones((2, 4), np.float32), np.ones((2,), np.float32)
    m = tp.save_model(f, (a, b), tmp_path / "f.tpm", names={"inputs": ["a", "b"], "outputs": ["h", "s"]})
    assert m.manifest["batch"]["dynamic"]
    assert [s.shape for s in m.signature.outputs] == [(None,), ()]
    assert sorted(r["scale"] for r in m.manifest["batch"]["rules"]) == [1, 1, 6]  # two reshapes, one full
    loaded = tp.load_model(tmp_path / "f.tpm")
    assert sorted(loaded.params) == ["const:0"]
    for n in (2, 5):
        a2 = np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32)
        b2 = np.ones((n,), np.float32)
        got = [t.numpy() for t in loaded(a2, b2)]
        want = [t.numpy() for t in f(tp.tensor(a2), tp.tensor(b2))]
        assert got[0].shape == (n * 6,)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-6)


def test_a_graph_that_branches_on_the_batch_keeps_it_fixed(tmp_path: Path) -> None:
    def f(x: tp.Tensor) -> tp.Tensor:
        return x * 2 if x.shape[0] < 4 else x.sum(axis=0)

    m = tp.save_model(f, np.ones((3, 2), np.float32), tmp_path / "b.tpm")
    assert not m.manifest["batch"]["dynamic"]
    assert "structure" in m.manifest["batch"]["reason"] or "differs" in m.manifest["batch"]["reason"]
    assert m.signature.inputs[0].shape == (3, 2)
    with pytest.raises(tp.ShapeError, match=r"input 'x': expected shape \[3, 2\], got \[4, 2\]"):
        m(np.ones((4, 2), np.float32))


def test_inputs_are_checked_by_name(tmp_path: Path) -> None:
    m = tp.save_model(lambda img, k: img * k, (np.ones((2, 3), np.float32), np.ones((2, 1), np.float32)),
                      tmp_path / "x.tpm")
    with pytest.raises(tp.ShapeError, match=r"input 'img': expected shape \[batch, 3\], got \[2, 4\]"):
        m(np.ones((2, 4), np.float32), np.ones((2, 1), np.float32))
    with pytest.raises(tp.DTypeError, match="input 'k': expected dtype float32, got int32"):
        m(np.ones((2, 3), np.float32), np.ones((2, 1), np.int32))
    with pytest.raises(tp.ShapeError, match="input 'k': batch size 3 differs"):
        m(np.ones((2, 3), np.float32), np.ones((3, 1), np.float32))
    with pytest.raises(TypeError, match=r"takes 2 input\(s\) \(img, k\), got 1"):
        m(np.ones((2, 3), np.float32))
    # JSON-style lists are cast to the input's dtype
    np.testing.assert_array_equal(m([[1, 2, 3]], [[2.0]]).numpy(), [[2, 4, 6]])


def test_load_model_refuses_damaged_files_with_their_kind(tmp_path: Path) -> None:
    p = tmp_path / "m.tpm"
    tp.save_model(tp.nn.Linear(3, 2), np.ones((1, 3), np.float32), p, key="s3cret")
    whole = p.read_bytes()
    tp.load_model(p, key="s3cret")
    cases = {"truncated": whole[:-5], "corrupted": whole[:-5] + bytes(b ^ 1 for b in whole[-5:])}
    for kind, data in cases.items():
        p.write_bytes(data)
        with pytest.raises(tp.ModelFileError) as ei:
            tp.load_model(p, key="s3cret")
        assert ei.value.kind == kind and kind in str(ei.value)
    p.write_bytes(whole)
    with pytest.raises(tp.ModelFileError, match="another key"):
        tp.load_model(p, key="wrong")


def test_save_model_refuses_what_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"output 0 .* is a int"):
        tp.save_model(lambda x: 3, np.ones((2, 2), np.float32), tmp_path / "n.tpm")
    with pytest.raises(TypeError, match=r"a function, a tp\.nn\.Module or a tp\.Model"):
        tp.save_model(42, np.ones((2, 2), np.float32), tmp_path / "n.tpm")
    with pytest.raises(ValueError, match="names gives"):
        tp.save_model(lambda x: x, np.ones((2, 2), np.float32), tmp_path / "n.tpm", names=["a", "b"])


def test_a_graph_with_an_op_this_process_lacks_is_named(tmp_path: Path) -> None:
    from triplane.proto import modelfile

    p = tmp_path / "m.tpm"
    m = tp.save_model(lambda x: tp.relu(x), np.ones((2, 3), np.float32), p)
    graph = m.graph.to_json().replace(b'"op":"relu"', b'"op":"my_custom_relu"')
    fields = {k: v for k, v in m.manifest.items() if k not in modelfile.CONTAINER_KEYS}
    modelfile.write(p, fields, graph, m.params)
    with pytest.raises(tp.ModelFileError, match="my_custom_relu") as ei:
        tp.load_model(p)
    assert ei.value.kind == "unknown_op" and "tp.register_op" in str(ei.value)
