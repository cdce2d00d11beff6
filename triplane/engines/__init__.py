"""Engines: the pluggable compute (op), storage (memory) and network parts of a node.

Built-ins are found in a dict; vendors add theirs through the entry-point groups
``triplane.engines.op``, ``triplane.engines.memory`` and ``triplane.engines.network``
(one path for all three: :mod:`triplane.engines.registry`). The contracts are in
:mod:`triplane.engines.protocols`, their errors in :mod:`triplane.engines.errors`.
"""

from triplane.engines.registry import get_memory_engine, get_op_engine, memory_engine_names, op_engine_names

__all__ = ["get_memory_engine", "get_op_engine", "memory_engine_names", "op_engine_names"]
