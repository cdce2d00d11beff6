"""ONNX round trips: a trained triplane model exported and run by onnxruntime, and an ONNX
model built with onnx.helper imported and run by triplane, give the same outputs (within
the stated tolerances); operators outside the op map are named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import triplane as tp  # noqa: E402
from triplane.sdk.nn import functional as F  # noqa: E402
from triplane.sdk.onnx import EXPORTS, Unsupported, from_onnx, to_onnx  # noqa: E402
from triplane.sdk.onnx.backend import TriplaneBackend  # noqa: E402

# float32 on both sides, the same operations in a different order (BLAS, fused kernels)
RTOL, ATOL = 1e-5, 1e-5


class Net(tp.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = tp.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = tp.nn.BatchNorm2d(4)
        self.fc = tp.nn.Linear(4 * 4 * 4, 16)
        self.ln = tp.nn.LayerNorm(16)
        self.out = tp.nn.Linear(16, 3)

    def forward(self, x: tp.Tensor) -> tp.Tensor:
        h = F.max_pool2d(tp.relu(self.bn(self.conv(x))), 2)
        h = tp.gelu(self.ln(self.fc(h.reshape(x.shape[0], -1))))
        return F.log_softmax(self.out(h), axis=-1)


def _trained() -> tuple[Net, np.ndarray]:
    tp.manual_seed(0)
    net = Net()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=16)
    opt = tp.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(net(tp.tensor(x)), tp.tensor(y)).backward()  # of log-probabilities: the same
        opt.step()
    return net, x


def test_trained_model_exported_runs_the_same_in_onnxruntime(tmp_path: Path) -> None:
    net, x = _trained()
    model = tp.save_model(net, x[:4], tmp_path / "net.tpm")
    proto = to_onnx(tp.load_model(tmp_path / "net.tpm"), path=tmp_path / "net.onnx")
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert {"Conv", "BatchNormalization", "MaxPool", "LayerNormalization", "LogSoftmax"} <= \
        {n.op_type for n in proto.graph.node}
    session = ort.InferenceSession(str(tmp_path / "net.onnx"), providers=["CPUExecutionProvider"])
    net.eval()
    for batch in (4, 16, 1):
        want = net(tp.tensor(x[:batch])).numpy()
        (got,) = session.run(None, {"x": x[:batch]})
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(model(x[:batch]).numpy(), want)


def test_batch_sized_shapes_stay_dynamic_in_onnx() -> None:
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10

    def f(x: tp.Tensor) -> tp.Tensor:  # a recurrent step: a state of zeros as wide as the batch
        n = x.shape[0]
        h = tp.zeros((n, 3)) + tp.tanh(x @ w)
        h = tp.broadcast_to(h.reshape(n, 1, 3), (n, 2, 3))
        return h.reshape(n * 6)[: n * 5]

    x = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    proto = to_onnx(f, x[:2])
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert {"Shape", "ConstantOfShape", "Expand"} <= {n.op_type for n in proto.graph.node}
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 2, 4):
        (got,) = session.run(None, {"x": x[:batch]})
        np.testing.assert_allclose(got, f(tp.tensor(x[:batch])).numpy(), rtol=RTOL, atol=ATOL)


def _helper_model() -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    w1 = rng.normal(size=(6, 5)).astype(np.float32)
    b1 = rng.normal(size=(6,)).astype(np.float32)
    k = rng.normal(size=(2, 1, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, alpha=0.5),
        helper.make_node("LeakyRelu", ["h"], ["a"], alpha=0.1),
        helper.make_node("Reshape", ["a", "shape"], ["img"]),
        helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c", "axes"], ["m"], keepdims=0),
        helper.make_node("Softmax", ["m"], ["p"], axis=-1),
        helper.make_node("Clip", ["h", "lo", "hi"], ["clipped"]),
        helper.make_node("ReduceSum", ["clipped", "one"], ["s"], keepdims=1),
        helper.make_node("Concat", ["p", "s"], ["y"], axis=1),
    ]
    inits = [numpy_helper.from_array(v, n) for n, v in [
        ("w1", w1), ("b1", b1), ("k", k), ("shape", np.array([0, 1, 2, 3], np.int64)),
        ("axes", np.array([1, 2], np.int64)), ("lo", np.array(-0.5, np.float32)),
        ("hi", np.array(0.5, np.float32)), ("one", np.array([1], np.int64))]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(proto)
    return proto, {"x": rng.normal(size=(7, 5)).astype(np.float32)}


def test_onnx_helper_model_imported_matches_onnxruntime(tmp_path: Path) -> None:
    proto, feeds = _helper_model()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    model = from_onnx(proto)
    assert model.signature.inputs == [tp.TensorSpec("x", "float32", (None, 5))]
    assert sorted(model.params) == ["b1", "hi", "k", "lo", "w1"]  # shapes and axes are folded in
    np.testing.assert_allclose(model(feeds["x"]).numpy(), want, rtol=RTOL, atol=ATOL)
    (got,) = TriplaneBackend.run_model(proto, [feeds["x"]])
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # back out to ONNX: onnxruntime runs triplane's export of it the same, at another batch too
    again = ort.InferenceSession(to_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(again.run(None, feeds)[0], want, rtol=RTOL, atol=ATOL)
    three = feeds["x"][:3]
    np.testing.assert_allclose(again.run(None, {"x": three})[0], session.run(None, {"x": three})[0],
                               rtol=RTOL, atol=ATOL)
    # and on through a model file: the same outputs
    model.save(tmp_path / "imported.tpm")
    np.testing.assert_array_equal(tp.load_model(tmp_path / "imported.tpm")(feeds["x"]).numpy(),
                                  model(feeds["x"]).numpy())


def test_unsupported_operators_are_named() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first"),
             helper.make_node("Resize", ["r", "", "scales"], ["y"], name="up")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    graph = helper.make_graph(nodes, "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(Unsupported, match=r"Resize \(node 'up'\)"):
        from_onnx(proto)
    with pytest.raises(Unsupported, match="Resize"):
        TriplaneBackend.prepare(proto)


def test_export_names_a_triplane_op_without_an_onnx_form(monkeypatch: pytest.MonkeyPatch) -> None:
    def f(x: tp.Tensor) -> tp.Tensor:
        return tp.relu(x) * 2

    monkeypatch.delitem(EXPORTS, "relu")
    with pytest.raises(Unsupported, match=r"\(relu\): no ONNX form for triplane op 'relu'"):
        to_onnx(f, np.ones((2, 3), np.float32))
    with pytest.raises(Unsupported, match="training=True"):
        to_onnx(lambda x: F.dropout(x, 0.5, training=True, seed=1), np.ones((2, 3), np.float32))
