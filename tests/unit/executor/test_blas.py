"""A big grouped task runs with every core; small ones and the count after it stay as set."""

from __future__ import annotations

import json

import pytest

from triplane.engines.op.numpy_engine import NumpyEngine
from triplane.executor.blas import WIDE_FLOPS, WideBlas
from triplane.executor.group import prepare
from triplane.proto.packet.group import PROGRAM_VERSION

threadpoolctl = pytest.importorskip("threadpoolctl", reason="threadpoolctl is not installed")


def _blas_threads() -> list[int]:
    blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
    return [c.num_threads for c in blas.lib_controllers]


@pytest.fixture
def one_thread():  # as a local cluster of as many executors as cores sets it
    if not _blas_threads():
        pytest.skip("numpy's BLAS is not visible to threadpoolctl")
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        yield


def test_a_wide_task_runs_with_the_threads_asked_and_puts_the_count_back(one_thread: None) -> None:
    blas = WideBlas(threads=3)
    with blas.wide(WIDE_FLOPS):
        assert set(_blas_threads()) == {3}
    assert set(_blas_threads()) == {1} and blas.widened == 1
    with blas.wide(WIDE_FLOPS / 2):  # small: left alone
        assert set(_blas_threads()) == {1}
    with WideBlas(threads=1).wide(10 * WIDE_FLOPS):  # one core: nothing to widen
        assert set(_blas_threads()) == {1}
    assert blas.widened == 1


def test_the_count_is_put_back_when_the_task_fails(one_thread: None) -> None:
    with pytest.raises(ZeroDivisionError), WideBlas(threads=2).wide(WIDE_FLOPS):
        raise ZeroDivisionError
    assert set(_blas_threads()) == {1}


def test_a_program_s_flops_come_from_the_op_table() -> None:
    prog = json.dumps({"v": PROGRAM_VERSION, "in": [[[512, 1024], "float32"], [[1024, 2048], "float32"]],
                       "nodes": [["z", "matmul", [0, 1], {}], ["r", "relu", [2], {}]], "out": [3]})
    prep = prepare(prog, 2, 1, NumpyEngine())
    assert prep.flops >= 2 * 512 * 1024 * 2048 >= WIDE_FLOPS  # the matmul's, and the relu's on top
    assert prep.flops < 2 * 512 * 1024 * 2048 + 10 * 512 * 2048
