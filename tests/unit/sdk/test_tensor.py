"""The lazy Tensor: recording, errors at the user's line, evaluation and caching."""

from __future__ import annotations

import numpy as np
import pytest

import triplane as tp
from triplane.embedded import EmbeddedSession
from triplane.proto.errors import DTypeError, KernelError, ShapeError
from triplane.sdk.session import use_session
from triplane.sdk.tensor import Tensor, realize


class CountingSession(EmbeddedSession):
    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def evaluate(self, outputs):  # type: ignore[no-untyped-def]
        self.runs += 1
        return super().evaluate(outputs)


def test_ops_are_recorded_not_computed_until_asked() -> None:
    s = CountingSession()
    with use_session(s):
        x = Tensor.from_array(np.arange(6.0).reshape(2, 3))
        y = (x * 2.0 + 1.0).sum(axis=1)
        assert s.runs == 0 and y._value is None
        assert y.shape == (2,) and y.dtype == tp.float64
        np.testing.assert_array_equal(y.numpy(), [9.0, 27.0])
        y.numpy()
        assert s.runs == 1  # the value is kept


def test_realize_computes_several_tensors_in_one_run() -> None:
    s = CountingSession()
    with use_session(s):
        x = Tensor.from_array(np.ones((3, 3)))
        h = tp.exp(x @ x)
        a, b = h.sum(), (h * 2.0).sum()
        realize(a, b)
        assert s.runs == 1
        assert b.item() == pytest.approx(2 * a.item())


def test_shape_error_names_op_shapes_and_the_users_line() -> None:
    x = Tensor.from_array(np.zeros((64, 784), dtype=np.float32))
    w = Tensor.from_array(np.zeros((10, 784), dtype=np.float32))
    with pytest.raises(ShapeError) as info:
        x @ w  # the line the message must point at
    msg = str(info.value)
    assert "matmul" in msg and "(64, 784)" in msg and "(10, 784)" in msg
    assert f"{__file__}:" in msg
    with pytest.raises(ShapeError, match=r"shapes \(2, 3\) and \(4,\) do not broadcast"):
        Tensor.from_array(np.zeros((2, 3))) + Tensor.from_array(np.zeros(4))


def test_values_are_read_only_and_leaves_can_be_reassigned() -> None:
    t = Tensor.from_array(np.zeros(3))
    with pytest.raises(ValueError):
        t.numpy()[0] = 1.0
    t.assign(np.array([1.0, 2.0, 3.0]))
    assert t.numpy().tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(Exception, match=r"shape \[2\] to a tensor of shape \[3\]"):
        t.assign(np.zeros(2))


def test_from_array_dtypes() -> None:
    assert Tensor.from_array([1.5, 2.0]).dtype == tp.float32  # Python floats: float32
    assert Tensor.from_array(np.array([1.5])).dtype == tp.float64  # numpy keeps its dtype
    assert Tensor.from_array([1, 2]).dtype == tp.int64
    assert Tensor.from_array([True]).dtype == tp.bool_
    with pytest.raises(TypeError):
        Tensor.from_array(["a"])
    with pytest.raises(DTypeError, match="unsupported dtype"):
        Tensor.from_array(np.zeros(2, dtype=np.complex64))


def test_scalars_are_weakly_typed() -> None:
    x = Tensor.from_array(np.ones(2, dtype=np.float16))
    assert (x * 2).dtype == tp.float16
    assert (x + 0.5).dtype == tp.float16
    i = Tensor.from_array(np.ones(2, dtype=np.int32))
    assert (i * 2).dtype == tp.int32
    assert (i * 0.5).dtype == tp.float64  # NEP 50: as numpy 2
    np.testing.assert_array_equal((i * 0.5).numpy(), [0.5, 0.5])
    assert (i + Tensor.from_array(np.ones(2, dtype=np.float64))).dtype == tp.float64
    assert (i * np.float32(2)).dtype == tp.float64  # a numpy scalar is strong: int32 with float32
    b = Tensor.from_array(np.ones(2, dtype=bool))
    assert (b + 1).dtype == tp.int64 and (b + True).dtype == tp.bool_
    u = Tensor.from_array(np.ones(2, dtype=np.uint8))
    with pytest.raises(OverflowError, match="Python integer 300 out of bounds for uint8"):
        u + 300
    assert not (u == -1).numpy().any()  # comparisons stay exact, as numpy 2's


def test_true_floor_division_and_remainder() -> None:
    x = Tensor.from_array(np.arange(6))
    q = x / 4
    assert q.dtype == tp.float64
    np.testing.assert_array_equal(q.numpy(), np.arange(6) / 4)
    images = Tensor.from_array(np.array([0, 128, 255], np.uint8))
    np.testing.assert_allclose((images / 255).numpy(), [0.0, 128 / 255, 1.0])
    a = np.array([-7, -1, 0, 5, 7])
    t = Tensor.from_array(a)
    for got, want in [(t // 2, a // 2), (t % 3, a % 3), (t % -3, a % -3),
                      (20 // (t + 8), 20 // (a + 8)), (20 % (t + 8), 20 % (a + 8)),
                      (2 / (t + 8), 2 / (a + 8)), (2.5 // (t + 8), 2.5 // (a + 8))]:
        assert got.dtype.name == want.dtype.name
        np.testing.assert_array_equal(got.numpy(), want)


def test_python_scalar_conversions() -> None:
    s = Tensor.from_array(np.array([[2.75]], np.float32))
    assert float(s) == 2.75 and isinstance(float(s), float)
    assert int(s) == 2 and isinstance(int(s), int)
    assert bool(s) is True
    assert len(Tensor.from_array(np.zeros((3, 2)))) == 3
    with pytest.raises(TypeError, match="one element"):
        float(Tensor.from_array(np.zeros(2)))
    with pytest.raises(TypeError, match="len"):
        len(Tensor.from_array(np.float32(1)))


def test_backward_accumulates_into_leaf_grads() -> None:
    w = Tensor.from_array(np.array([1.0, 2.0]), requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])
    (w * 3.0).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 7.0])
    with pytest.raises(TypeError, match="floating-point"):
        Tensor.from_array(np.arange(3), requires_grad=True)


def test_backward_after_reading_the_value() -> None:
    w = Tensor.from_array(np.array([3.0]), requires_grad=True)
    loss = (w * w).sum()
    assert loss.item() == 9.0  # realized ...
    loss.backward()            # ... yet gradients still flow through it
    assert w.grad.numpy().tolist() == [6.0]


def test_kernel_errors_name_the_node_and_the_users_line() -> None:
    a = Tensor.from_array(np.array([1, 2], dtype=np.int64))
    b = Tensor.from_array(np.array([1, 0], dtype=np.int64))
    q = a // b
    with pytest.raises(KernelError, match=r"\(floor_divide\): .*division by zero.*made at .*test_tensor.py:"):
        q.numpy()


def test_training_loop_compiles_once() -> None:
    s = CountingSession()
    with use_session(s):
        rng = np.random.default_rng()
        w = Tensor.from_array(rng.standard_normal((4, 1)), requires_grad=True)
        x = Tensor.from_array(rng.standard_normal((16, 4)))
        y = Tensor.from_array(rng.standard_normal((16, 1)))
        losses = []
        for _ in range(5):
            err = x @ w - y
            loss = (err * err).sum() / 16.0
            (g,) = tp.grad(loss, [w])
            new_w = w - g * 0.1
            realize(loss, new_w)
            losses.append(loss.item())
            w.assign(new_w)
        assert s.traces.misses == 1 and s.traces.hits == 4  # compiled once, replayed
        assert losses == sorted(losses, reverse=True)
