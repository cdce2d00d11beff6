"""The graph contract in Python: dtypes, the IR, the op table and validation.

Nothing here imports the rest of triplane.
"""
