"""The autograd pass: correctness against finite differences and its error cases."""

from __future__ import annotations

import numpy as np
import pytest

import triplane as tp
from triplane.proto import optable
from triplane.proto.autograd import autograd
from triplane.proto.builder import Builder
from triplane.proto.errors import GraphError, NotDifferentiableError
from triplane.proto.ir import TensorType
from triplane.proto.opdef import OpDef
from triplane.proto.validate import validate
from triplane.sdk.tensor import Tensor
from triplane.testing import check_grad


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def test_broadcasting_gradients_sum_over_broadcast_axes(rng: np.random.Generator) -> None:
    # (3,1) * (1,4) -> (3,4): each input's gradient sums over the axis it was broadcast on.
    check_grad(lambda a, b: a * b - a / (b * b + 1.0),
               [rng.standard_normal((3, 1)), rng.standard_normal((1, 4))])
    check_grad(lambda a, b: a + b, [rng.standard_normal((2, 3, 4)), rng.standard_normal((4,))])


def test_shared_input_accumulates_every_use(rng: np.random.Generator) -> None:
    x = rng.standard_normal(5)
    t = tp.Tensor.from_array(x)
    (g,) = tp.grad((t * t + t * 3.0 - t).sum(), [t])
    np.testing.assert_allclose(g.numpy(), 2 * x + 2, rtol=1e-12)
    check_grad(lambda a: tp.exp(a) * a + a @ a, [rng.standard_normal(4)])


def test_second_derivative_by_differentiating_a_gradient(rng: np.random.Generator) -> None:
    x = rng.uniform(0.5, 2.0, size=6)
    t = tp.Tensor.from_array(x)
    (g,) = tp.grad((t * t * t).sum(), [t])          # 3 x^2
    (h,) = tp.grad(g.sum(), [t])                      # 6 x
    np.testing.assert_allclose(g.numpy(), 3 * x**2, rtol=1e-12)
    np.testing.assert_allclose(h.numpy(), 6 * x, rtol=1e-12)
    # and the gradient graph itself passes the finite-difference check
    check_grad(lambda a: tp.grad((tp.exp(a) * a).sum(), [a])[0], [x])


def test_matmul_gradients_with_vectors_and_batches(rng: np.random.Generator) -> None:
    check_grad(lambda a, b: a @ b, [rng.standard_normal((3, 4)), rng.standard_normal(4)])
    check_grad(lambda a, b: a @ b, [rng.standard_normal(3), rng.standard_normal((3, 2))])
    check_grad(lambda a, b: a @ b, [rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((5, 4, 2))])


def test_unconnected_input_gets_zero_gradient() -> None:
    a = tp.Tensor.from_array(np.ones(3))
    b = tp.Tensor.from_array(np.full((2, 2), 7.0))
    ga, gb = tp.grad((a * 2.0).sum(), [a, b])
    np.testing.assert_array_equal(ga.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(gb.numpy(), np.zeros((2, 2)))


def test_non_scalar_output_needs_grad_output(rng: np.random.Generator) -> None:
    x = tp.Tensor.from_array(rng.standard_normal(3))
    y = x * x
    with pytest.raises(NotDifferentiableError, match="grad_output"):
        tp.grad(y, [x])
    v = rng.standard_normal(3)
    (g,) = tp.grad(y, [x], grad_output=tp.Tensor.from_array(v))
    np.testing.assert_allclose(g.numpy(), 2 * x.numpy() * v, rtol=1e-12)


def test_integer_tensors_have_no_gradient() -> None:
    i = tp.Tensor.from_array(np.arange(3))
    f = tp.Tensor.from_array(np.ones(3, dtype=np.float32))
    with pytest.raises(NotDifferentiableError, match="only floating-point"):
        tp.grad((f * 2.0).sum(), [i])


@pytest.fixture
def opaque_op():
    """An op without a gradient rule, registered for the duration of a test."""
    from triplane.engines.op.numpy_kernels import KERNELS

    optable.register(OpDef("test_opaque", "test", 1, lambda ins, a: ins[0]))
    KERNELS["test_opaque"] = lambda ins, a, out: ins[0] * 1
    yield "test_opaque"
    optable.unregister("test_opaque")
    KERNELS.pop("test_opaque", None)


def test_asking_through_a_non_differentiable_op_names_the_node(opaque_op: str) -> None:
    x = tp.Tensor.from_array(np.ones(3))
    y = (x * 2.0)
    z = Tensor(opaque_op, [y], optable.get(opaque_op).normalise_attrs({}), y._type)
    with pytest.raises(NotDifferentiableError, match=r"\(test_opaque\): test_opaque has no gradient"):
        tp.grad(z.sum(), [x])
    # ... but a gradient that does not pass through it is fine
    with pytest.raises(NotDifferentiableError, match="test_opaque"):
        tp.grad((x * 3.0).sum() + z.sum() * 0.0, [x])  # a zero factor does not excuse it
    (g,) = tp.grad((y * 3.0).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [6.0, 6.0, 6.0])


def test_pass_on_raw_ir_appends_valid_gradient_nodes() -> None:
    b = Builder(prefix="n")
    x = b.op("input", tensor="x", shape=(2, 3), dtype="float64")
    w = b.op("input", tensor="w", shape=(3, 4), dtype="float64")
    loss = b.op("sum", b.op("exp", b.op("matmul", x, w)))
    g = b.graph([loss])
    g2, (gx, gw) = autograd(g, loss.id, [x.id, w.id])
    assert g2.outputs == (loss.id, gx, gw)
    assert g2.type_of(gx) == TensorType((2, 3), tp.float64)
    assert g2.type_of(gw) == TensorType((3, 4), tp.float64)
    validate(g2)  # the pass's output is a well-formed graph
    assert set(g.nodes) < set(g2.nodes)  # nothing of the forward graph is changed


def test_pass_rejects_unknown_ids() -> None:
    b = Builder()
    x = b.op("full", value=1.0, shape=(2,), dtype="float32")
    with pytest.raises(GraphError, match="'nope' is not a node"):
        autograd(b.graph([x]), "nope", [x.id])
