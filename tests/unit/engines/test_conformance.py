"""The op-engine conformance kit, and the engines run through it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from triplane.engines import get_op_engine
from triplane.engines.op.cupy_engine import gpu_available
from triplane.engines.op.numpy_engine import NumpyEngine
from triplane.engines.testing import OpEngineConformance, check_op_engine, covered_ops
from triplane.proto import optable


def test_every_op_of_the_table_has_a_case() -> None:
    # `input` is bound by the runtime, never run by an engine.
    missing = set(optable.names()) - covered_ops() - {"input"}
    assert not missing, f"add conformance cases for: {sorted(missing)}"


class TestNumpyEngine(OpEngineConformance):
    @pytest.fixture
    def op_engine(self) -> Any:
        return get_op_engine("numpy")


class _OffByOne(NumpyEngine):
    """A faulty engine: its matmul is wrong by a little, its tanh raises."""

    def run(self, op: str, inputs: Any, attrs: Any, out: Any) -> Any:
        if op == "tanh":
            raise RuntimeError("driver fault")
        result = super().run(op, inputs, attrs, out)
        return result + np.asarray(1e-3, result.dtype) if op == "matmul" else result


def test_the_kit_catches_a_faulty_engine() -> None:
    problems = check_op_engine(_OffByOne(), float_dtypes=["float32"])
    text = "\n".join(map(str, problems))
    assert {p.case.op for p in problems} == {"matmul", "tanh"}, text
    assert "values differ from numpy" in text and "raised RuntimeError: driver fault" in text


_gpu, _why = gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu, reason=f"needs a CUDA GPU with cupy: {_why}")
class TestCupyEngine(OpEngineConformance):
    @pytest.fixture
    def op_engine(self) -> Any:
        return get_op_engine("cupy")


def test_cupy_engine_explains_why_it_cannot_start() -> None:
    if _gpu:
        pytest.skip("a GPU is present: the engine starts")
    from triplane.engines.op.cupy_engine import CupyEngine, GPUUnavailable

    with pytest.raises(GPUUnavailable, match=r"cupy|CUDA"):
        CupyEngine()
