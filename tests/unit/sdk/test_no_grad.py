"""tp.no_grad(): nothing recorded inside it carries gradients, as a context manager, as a
decorator, nested, and per thread; outside it everything is as before."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import triplane as tp
from triplane.proto.errors import NotDifferentiableError
from triplane.sdk import tensor as tensor_mod
from triplane.sdk.autograd import is_grad_enabled, no_grad
from triplane.testing import assert_close


def _w() -> tp.Tensor:
    return tp.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)


def test_inside_no_grad_nothing_flows_back() -> None:
    w = _w()
    with tp.no_grad():
        assert not tp.is_grad_enabled()
        y = (w * w).sum()
    assert tp.is_grad_enabled()
    assert y.item() == 14.0  # it still computes
    with pytest.raises(NotDifferentiableError, match="no_grad"):
        y.backward()


def test_a_no_grad_tensor_is_a_constant_for_gradients() -> None:
    w = _w()
    with tp.no_grad():
        c = w * 2.0  # treated as a constant below
    loss = (c * w).sum()  # d/dw = c = 2w (not 4w)
    loss.backward()
    assert w.grad is not None
    assert_close(w.grad.numpy(), np.array([2.0, 4.0, 6.0]))
    (g,) = tp.grad((c * c).sum() + w.sum(), [w])
    assert_close(g.numpy(), np.ones(3))


def test_decorator_and_nesting() -> None:
    w = _w()

    @tp.no_grad()
    def predict(x: tp.Tensor) -> tp.Tensor:
        assert not is_grad_enabled()
        with no_grad():
            inner = x * 3.0
        assert not is_grad_enabled()  # the outer block is still open
        return inner + x

    y = predict(w)
    assert is_grad_enabled() and predict.__name__ == "predict"
    with pytest.raises(NotDifferentiableError):
        y.sum().backward()
    assert not tensor_mod.record_hooks, "the record hook stays installed after the block"


def test_the_mode_is_per_thread() -> None:
    seen: list[bool] = []
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait()
        w = _w()
        y = (w * w).sum()
        y.backward()  # recorded with gradients: this thread is not in no_grad
        seen.append(w.grad is not None)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with tp.no_grad():
        inside.set()
        done.wait(10)
    t.join()
    assert seen == [True]


def test_exceptions_close_the_block() -> None:
    with pytest.raises(RuntimeError), tp.no_grad():
        raise RuntimeError("boom")
    assert is_grad_enabled() and not tensor_mod.record_hooks


def test_parameter_updates_by_hand_under_no_grad() -> None:
    # the PyTorch idiom of a manual SGD step
    w = _w()
    (w * w).sum().backward()
    assert w.grad is not None
    with tp.no_grad():
        new = w - 0.25 * w.grad
    w.assign(new)
    w.grad = None
    assert_close(w.numpy(), np.array([0.5, 1.0, 1.5]))
    (w * w).sum().backward()
    assert_close(w.grad.numpy(), np.array([1.0, 2.0, 3.0]))
