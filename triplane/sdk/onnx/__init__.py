"""ONNX in and out (the ``onnx`` package is needed: ``pip install onnx``; docs/onnx.md).

* :func:`from_onnx`: an ONNX model -> a ``tp.Model`` (call it, save it as a model file).
* :func:`to_onnx`: a ``tp.Model`` (or a function/module traced on example inputs) -> an
  ONNX ``ModelProto``, which onnxruntime runs.
* :class:`TriplaneBackend` (``backend.py``): the ``onnx.backend.base.Backend`` that the
  ONNX node tests run against.

The op map is :data:`import_ops.OPS` (ONNX -> triplane) and :data:`export.EXPORTS`
(triplane -> ONNX); an operator outside it raises :class:`Unsupported` naming it.
"""

from triplane.sdk.onnx.export import EXPORTS, to_onnx
from triplane.sdk.onnx.import_ops import Unsupported
from triplane.sdk.onnx.importer import check_supported, from_onnx, supported_ops

__all__ = ["EXPORTS", "Unsupported", "check_supported", "from_onnx", "supported_ops", "to_onnx"]
