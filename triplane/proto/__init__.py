"""The graph contract in Python: dtypes, the IR, the op table and validation.

Nothing here imports the rest of triplane. Importing the package fills the op table with
the built-in ops (:func:`triplane.proto.ops.register_all`).
"""

from triplane.proto.ops import register_all

register_all()
