"""triplane as an ONNX backend (``onnx.backend.base.Backend``), so that the node tests
shipped inside the ``onnx`` package run against it (``tests/onnx_node_tests.py``).

``prepare`` checks that every operator is one triplane imports (else :class:`Unsupported`
naming them); ``run`` records the ONNX graph on the given arrays as triplane ops and runs
it in the current session (in this process by default, or the cluster of ``tp.connect``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx.backend.base import Backend, BackendRep

from triplane.sdk.onnx.importer import check_supported, graph_inputs, initializers, interpret, opset_of
from triplane.sdk.tensor import Tensor, realize

__all__ = ["TriplaneBackend", "TriplaneRep"]


class TriplaneRep(BackendRep):
    def __init__(self, model: Any) -> None:
        self.model = model
        self.opset = opset_of(model)
        self.inputs = [i.name for i in graph_inputs(model.graph)]
        self.consts = {k: Tensor.from_array(v) for k, v in initializers(model.graph).items()}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = {k: Tensor.from_array(np.asarray(v)) for k, v in inputs.items()}
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = {k: Tensor.from_array(np.asarray(v)) for k, v in zip(self.inputs, arrays)}
        outs = interpret(self.model.graph, feeds, self.opset, self.consts)
        realize(*outs)
        return tuple(np.asarray(o.numpy()) for o in outs)


class TriplaneBackend(Backend):
    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        try:
            check_supported(model)
        except Exception:
            return False
        return True

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> TriplaneRep:
        super().prepare(model, device, **kwargs)  # onnx's own model check
        check_supported(model)
        return TriplaneRep(model)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> Sequence[np.ndarray]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"
