"""The built-in op table, one module a group, in the order of the issue's list.

Importing this package registers every built-in op with :mod:`triplane.proto.optable`.
"""

from triplane.proto.ops import creation, elementwise, fused, linalg, nn, reduce, shape  # noqa: F401
