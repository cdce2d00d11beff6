"""Engines: the pluggable compute (op), storage (memory) and network parts of a node.

Built-ins are found in a dict; vendors add theirs through the entry-point groups
``triplane.engines.op``, ``triplane.engines.memory`` and ``triplane.engines.network``.
"""

from triplane.engines.registry import get_op_engine, op_engine_names

__all__ = ["get_op_engine", "op_engine_names"]
